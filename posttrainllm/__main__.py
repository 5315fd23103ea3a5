from posttrainllm.cli import main

raise SystemExit(main())
