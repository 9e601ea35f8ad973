"""`python -m engine.server` runs llmserve."""

from engine.server.cli import main

main()
