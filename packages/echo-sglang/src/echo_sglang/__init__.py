"""ECHO as an SGLang speculative-decoding plugin (the ``echo-sglang`` package).

The only code in ECHO that imports sglang, and only lazily: :mod:`.plugin` (entry point),
:mod:`.spec_algo` and :mod:`.worker` import it inside functions or are imported by them. The rest
is plain torch over echo-core/echo-scheduler and is tested on CPU against SGLang's own kernels:

- :mod:`.args`, :mod:`.config`: the ``--speculative-echo-*`` flags, checked against EAGLE's;
- :mod:`.eagle_pool`: SGLang's EAGLE draft pool as an echo-core candidate pool;
- :mod:`.selection`, :mod:`.step`: a policy driven over that pool, one step end to end;
- :mod:`.padded`, :mod:`.masks`: SGLang's padded verify layout and its mask encodings;
- :mod:`.pool_capture`: the hook that hands EAGLE's pool to ECHO;
- :mod:`.graph_pool`: the same pool read back after a replay of the draft-decode CUDA graph.

Launch: ``sglang serve --model-path ... --speculative-algorithm ECHO
--speculative-draft-model-path ... --speculative-num-steps 4 --speculative-eagle-topk 4
--speculative-num-draft-tokens 16 --speculative-echo-budget auto`` (see the package README).
"""

from echo_sglang.args import ENV_VAR, EchoArgs, PluginConfigError, export_args

__all__ = ["ENV_VAR", "EchoArgs", "PluginConfigError", "export_args"]
