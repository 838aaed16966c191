"""The replay engine: every group-size controller, offline, on synthetic lengths, a
prompt pool or a policy's recorded rollouts, priced by a cost model. numpy only."""
