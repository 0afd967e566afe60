"""The training state on disk: checkpoints (manifest, checksums, the resume check) and the state keyed
by the whole model's parameter names, re-sharded to any plan (layout_state)."""
