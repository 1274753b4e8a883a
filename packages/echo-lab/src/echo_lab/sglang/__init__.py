"""A real SGLang server on this machine's CPU, for tests and benchmarks of the ECHO plugin.

:mod:`~echo_lab.sglang.harness` starts ``sglang.launch_server`` from the environment that
``scripts/sglang/setup_env.sh`` builds (its own venv, the embedded model, ECHO's head as an
SGLang draft) in one of three modes, plain, EAGLE-3 (SGLang's own speculative worker with ECHO's
head) or ECHO (the plugin), and talks to it over HTTP.
"""
