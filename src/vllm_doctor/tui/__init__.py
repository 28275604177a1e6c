"""The triage session (Textual). Importing this package does not import Textual: the app is built by
`cli/tui.py` when `vllm-doctor tui`, `--tui` or `run --tui` asks for it. See docs/DESIGN.md."""
