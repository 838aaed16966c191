"""Rewards: verifiable checkers per task (``verifiers``) and the weighted mix of
reward terms a training run optimises (``mix``)."""
