"""Per-layer strategies (Galvatron-BMW) run for real: the device meshes built once from the axis
table (meshes), one apply step per parallel axis composed in one ordered function per stage
(parallelize), the styles each step uses (tensor_parallel, tp_apply, tp_styles, sequence_parallel, selective,
zero), Slice-Gather between layouts (regroup), the gradient sync (grad_sync), what is refused before
launch (hybrid) and one rank's set-up (hybrid_rank)."""
