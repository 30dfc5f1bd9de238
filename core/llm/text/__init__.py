"""Text in and out: the tokenizer (in process or in a child process), chat templates in a
bounded sandbox, and a token's readable text."""
