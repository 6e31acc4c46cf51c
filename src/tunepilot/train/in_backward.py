"""The optimizer step inside backward (`training.optimizer_in_backward`, S1): no update ever
holds every gradient at once.

PyTorch documents the pattern ("How to save memory by fusing the optimizer step into the
backward pass"): one optimizer per parameter, stepped and its gradient freed in the
parameter's post-accumulate-grad hook, so that at most the gradients of the parameters whose
backward is in flight are alive. For a full fine-tune that removes the gradients term of the
step (a bf16 8B model: 15 GiB) from the peak.

`InBackward` looks like one optimizer to the loop, the pilot and the checkpoint:
`param_groups` (the loop sets each update's lr there *before* backward, since the step runs
inside it), `state`, `state_dict()` in the one-optimizer index form (so a checkpoint holds the
same files as without it), `load_state_dict`, `step()` and `zero_grad()` (both nothing: the
hooks did the work). The hooks also add up the squared gradient norm before each step, so an
update still records its gradient norm; clipping is refused by the schema, because every
parameter steps before the norm of the whole gradient is known.

`deferred()` switches the hooks off for a pass whose gradients must stay in `.grad` (the
pilot's gradient comparisons, or an update of several microbatches); `step()` then steps
what was deferred.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any


class InBackward:
    """One optimizer per parameter, stepped in that parameter's post-accumulate-grad hook."""

    def __init__(self, params: Sequence[Any], make: Callable[[list[Any]], Any]) -> None:
        import torch

        self.params = list(params)
        self.optimizers = [make([p]) for p in self.params]
        self._of = {id(p): o for p, o in zip(self.params, self.optimizers, strict=True)}
        self.enabled = True
        self._norm_sq: Any = None
        self._steps = 0
        self._torch = torch
        # The hooks hold this object weakly: an InBackward that is dropped (the pilot's update
        # audit builds one and throws it away) leaves inert hooks, never a second optimizer
        # stepping the same parameters.
        me = weakref.WeakMethod(self._hook)

        def hook(param: Any) -> None:
            live = me()
            if live is not None:
                live(param)

        self._handles = [p.register_post_accumulate_grad_hook(hook) for p in self.params]

    def __del__(self) -> None:
        for handle in getattr(self, "_handles", []):
            handle.remove()

    def _hook(self, param: Any) -> None:
        if not self.enabled or param.grad is None:
            return
        # the norm in fp32 without an fp32 copy of the gradient
        square = self._torch.linalg.vector_norm(param.grad.detach(), dtype=self._torch.float32)
        square = square * square
        self._norm_sq = square if self._norm_sq is None else self._norm_sq + square
        optimizer = self._of[id(param)]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        self._steps += 1

    # -- what the loop asks of an optimizer ----------------------------------------------
    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [group for o in self.optimizers for group in o.param_groups]

    @property
    def state(self) -> dict[Any, Any]:
        return {p: o.state[p] for p, o in zip(self.params, self.optimizers, strict=True)
                if p in o.state}  # fmt: skip

    def step(self) -> None:
        """Step the parameters that still hold a gradient: none after an ordinary backward
        (each stepped in its hook), all of them after a deferred one (an update the pilot
        builds from several microbatches steps once, when all of them are in)."""
        for param in self.params:
            if param.grad is not None:
                self._optimizer_of(param).step()
                self._optimizer_of(param).zero_grad(set_to_none=True)

    def _optimizer_of(self, param: Any) -> Any:
        return self._of[id(param)]

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Gradients were freed in the hooks; a deferred pass's are cleared here."""
        for p in self.params:
            p.grad = None

    @property
    def stepped(self) -> bool:
        """Whether a hook stepped since the last `take_norm` (False after a deferred pass)."""
        return self._norm_sq is not None

    def take_norm(self) -> Any:
        """The update's gradient norm (a 0-d tensor on the device), summed in the hooks; 0
        when no parameter stepped. Resets for the next update."""
        norm_sq, self._norm_sq = self._norm_sq, None
        if norm_sq is None:
            return self._torch.zeros(())
        return norm_sq.sqrt()

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """Hooks off: gradients accumulate in `.grad` as without this option; nothing steps."""
        before, self.enabled = self.enabled, False
        try:
            yield
        finally:
            self.enabled = before

    def remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    # -- checkpoints: the one-optimizer index form -----------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """State keyed 0..n-1 in parameter order and one param group holding them all, as
        `torch.optim.Optimizer.state_dict()` of a single optimizer over the same parameters
        gives it (every per-parameter optimizer shares the hyperparameters)."""
        state: dict[int, Any] = {}
        for index, optimizer in enumerate(self.optimizers):
            saved = optimizer.state_dict()["state"]
            if 0 in saved:
                state[index] = saved[0]
        group = {k: v for k, v in self.optimizers[0].state_dict()["param_groups"][0].items()
                 if k != "params"}  # fmt: skip
        everything = list(range(len(self.params)))
        return {"state": state, "param_groups": [{**group, "params": everything}]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        groups = state_dict["param_groups"]
        indices = [i for g in groups for i in g["params"]]
        if len(groups) != 1 or indices != list(range(len(self.params))):
            raise ValueError(f"saved state covers {len(indices)} parameters in {len(groups)} "
                             f"group(s); this model trains {len(self.params)} in one")  # fmt: skip
        group = {k: v for k, v in groups[0].items() if k != "params"}
        for index, optimizer in enumerate(self.optimizers):
            per_param = state_dict["state"].get(index)
            optimizer.load_state_dict({
                "state": {0: per_param} if per_param is not None else {},
                "param_groups": [{**group, "params": [0]}],
            })  # fmt: skip
