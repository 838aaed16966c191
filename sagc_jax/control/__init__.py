"""Host-side group-size control: the SAGC controller, the rollout budget P(G) and the
length simulator. numpy only (no JAX), so it runs anywhere in microseconds."""
