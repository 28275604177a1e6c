from vllm_doctor.cli.main import main

raise SystemExit(main())
