"""Generating text: sampling, constrained output, the prefix cache, the decode loop, speculative
decoding, continuous batching, and ``TextModel``, the facade a program, the GUI and the server use."""
