from meshscale.cli import main

raise SystemExit(main())
