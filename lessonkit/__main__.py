from lessonkit.cli import main

raise SystemExit(main())
