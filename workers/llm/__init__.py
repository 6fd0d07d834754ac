"""The LLM layer every method shares: an OpenAI-compatible client and the local model.

* :mod:`workers.llm.client`: calls with retries, a concurrency bound, a call cap, and the
  cost of a run (:class:`~workers.llm.client.LLMCosts`: calls, tokens, wall time);
* :mod:`workers.llm.engine`: continuous batching on llama.cpp (its C API, from
  :mod:`workers.llm.llamacpp`), several sequences decoded in one batch;
* :mod:`workers.llm.serve`: that engine behind an OpenAI-compatible HTTP API;
* :mod:`workers.llm.local`: the packaged SmolLM2 served by it in a subprocess.

What goes into a prompt is each method's business (``workers.methods.dpkps.prompting``): nothing
here builds one.
"""
