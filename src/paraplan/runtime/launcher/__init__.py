"""Starting the ranks and what surrounds them: every check before launch, processes from a forkserver
or torchrun, the teardown, the printed launch for many machines, and runs for `plan --prove`."""
