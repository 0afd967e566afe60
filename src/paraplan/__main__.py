from paraplan.cli import run

run()
