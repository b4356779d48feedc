from llmcap.cli import main

main()
