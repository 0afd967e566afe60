"""This machine as the program touches it: atomic files (fileio.py), its free memory (host.py), a
free loopback port (localnet.py). No paraplan concept lives here; everything may import it."""
