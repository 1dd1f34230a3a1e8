"""Serving every task of a run from one encoder pass: a bundle (one encoder checkpoint, its
tokenizer, the best heads of several tasks) and an HTTP service that tokenizes each text once,
runs the encoder once per batch and applies every requested task's head to the shared states.

- ``bundle``: the bundle format, its writer and its reader;
- ``engine``: the model side (tokenize, encode, apply heads, decode spans), no HTTP;
- ``batching``: dynamic batching of concurrent requests into one engine call;
- ``app``: the FastAPI application (``bertvision serve``).
"""
