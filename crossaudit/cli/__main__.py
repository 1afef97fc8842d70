from crossaudit.cli.main import main

raise SystemExit(main())
