from posttrainllm.tools.cli import main

raise SystemExit(main())
