"""A/B of the module state check that every split call makes
(`_split.ModuleState`: built before the call, checked after), between
another version of plugin/python/dynaflow/_split.py and this checkout's,
loaded side by side in one process and alternated, on a 32-layer
transformers Llama with tiny widths (421 modules).

    git show REV:plugin/python/dynaflow/_split.py > old_split.py
    .venv/bin/python bench/module_state_ab.py old_split.py
"""

import importlib.util
import os
import statistics
import sys
import timeit

import transformers as tf

ROUNDS, REPEAT, NUMBER = 15, 3, 20


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "plugin", "python",
                        "dynaflow", "_split.py")
    versions = {"old": load("old_split", sys.argv[1]), "new": load("new_split", here)}
    config = tf.LlamaConfig(vocab_size=128, hidden_size=64, num_hidden_layers=32,
                            num_attention_heads=4, intermediate_size=128, num_key_value_heads=2)
    modules = list(tf.AutoModelForCausalLM.from_config(config).model.named_modules())
    samples = {k: [] for k in versions}
    for _ in range(ROUNDS):
        for name, split in versions.items():
            def call():
                split.ModuleState(modules).check()
            best = min(timeit.repeat(call, number=NUMBER, repeat=REPEAT)) / NUMBER
            samples[name].append(best * 1e6)
    old, new = statistics.median(samples["old"]), statistics.median(samples["new"])
    print(f"ModuleState + check, {len(modules)} modules: old {old:.0f} us, new {new:.0f} us, "
          f"new / old {new / old:.3f}")


if __name__ == "__main__":
    main()
