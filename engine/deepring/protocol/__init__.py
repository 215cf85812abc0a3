"""The protocol layer over deepring_recipe, shared by the HTTP frontend and offline `LLM`:
request bodies to prompt token ids and sampling parameters (prepare), engine output to
protocol events (output), error bodies in each protocol's shape (errors), the prompt template
of a model family (formats), and the V4.1 tokenizer file (tokenizer). No torch here."""
