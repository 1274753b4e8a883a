"""Model classes ECHO adds to SGLang's registry (``ModelRegistry.register("echo_sglang.models")``,
done by :func:`echo_sglang.plugin.register`). Each module imports sglang at module level and is
only ever imported inside an SGLang process."""
