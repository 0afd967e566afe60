"""Plans of whole-layer stages under torch's pipelining schedules: the stage loop every stage plan
runs (stage_loop), and plain pipelines with data-parallel replicas (pipeline_rank)."""
