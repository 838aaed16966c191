"""What every layer runs on: processes and device placement (``distributed``, ``mesh``),
compiled programs and their count (``compilation``), checkpoints, run storage (local
or gs://), metrics files and the run lock."""
