from paraplan.cli import main

raise SystemExit(main())
