"""Model I/O shared by the trainer, the searchers and the CLI: tokenizer, tiny model, log-probs."""
