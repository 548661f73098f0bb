"""The TabGPT guide's API under the paths it imports from (``tabgpt.models``,
``tabgpt.training``, ``tabgpt.serving``), as a thin face over ``neural_arch.models.tabgpt``,
``neural_arch.data.tabular`` and ``neural_arch.training``.

Nothing is imported here, so ``neural_arch.tabgpt.serving`` stays free of the distributed
package; ``neural_arch.tabgpt.training`` brings it in.
"""
