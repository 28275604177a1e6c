from vllm_doctor.cli import main

raise SystemExit(main())
