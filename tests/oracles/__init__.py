"""Reference implementations the tests compare against, built from their authors' own sources."""
