"""`convert --init-head DIR`: training starts from an already trained head instead of a freshly seeded one.

Fine-tuning a head on new data (the target's own answers, a new domain) keeps what it learned before. The head
must be eagle-trt's own layout (a `heads/` dir, q8_0 rows or not, or a checkpoint's `draft/`), made for this
target: the same hidden size and aux layers. Its draft vocabulary (size and `d2t`) and MLP width are kept, so
`--draft-vocab-size` / `--head-intermediate-size` may be left out, and must match where given.

    init, vocab, width = open_init_head("heads/qwen2.5-coder-0.5b-instruct", trains=True, brings_own=False,
                                        draft_vocab_size=None, intermediate_size=None)   # fails fast; the head's own
    init.check(model, aux_ids)                                          # target loaded: fails before the features
    ...                                                                 # head attached
    d2t = init.load_into(model)                                         # weights copied; the d2t to train with
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from eagle_trt.errors import InputError

CONFIG, WEIGHTS = "config.json", "model.safetensors"


@dataclass
class InitHead:
    path: Path
    config: dict

    @property
    def draft_vocab_size(self) -> int | None:
        return self.config.get("draft_vocab_size")

    @property
    def intermediate_size(self) -> int | None:
        return self.config.get("intermediate_size")

    def fill(self, draft_vocab_size: int | None, intermediate_size: int | None) -> tuple[int | None, int | None]:
        """The head's draft vocab size and MLP width for convert's options; a given option must match them."""
        for flag, given, own in (("--draft-vocab-size", draft_vocab_size, self.draft_vocab_size),
                                 ("--head-intermediate-size", intermediate_size, self.intermediate_size)):
            if given is not None and own is not None and int(given) != int(own):
                raise InputError(f"{flag} {given} differs from the --init-head {self.path}'s ({own}); leave it out "
                                 "(the head's own is kept) or start a fresh head without --init-head")
        return (draft_vocab_size if draft_vocab_size is not None else self.draft_vocab_size,
                intermediate_size if intermediate_size is not None else self.intermediate_size)

    def check(self, model, aux_ids: list[int]):
        """The head read and checked against the loaded target (its hidden size, fc width, layout and the aux layers
        `aux_ids` the head trained here reads): right after the target loads, before the data and features."""
        from eagle_trt.interop.import_head import load_head

        target = model.config.to_dict()
        fmt_name, head = load_head(self.path, target.get("text_config") or target)
        if fmt_name != "modelopt" or not head.hidden_prenorm:
            raise InputError(f"--init-head {self.path} is a {fmt_name} head; training continues only from eagle-trt's "
                             "own layout (a head `convert` trained, or its heads/ copy)")
        if head.aux_ids != list(aux_ids):
            raise InputError(f"--init-head {self.path} reads the target's layers {head.aux_ids}; the head trained here "
                             f"reads {list(aux_ids)}: give a head made for this model")
        return head

    def load_into(self, model) -> torch.Tensor | None:
        """Copy the head's weights into the attached `model.eagle_module` (every tensor present, every shape equal)
        and return its d2t (None at full vocab), which replaces the one convert would pick from the data."""
        head = self.check(model, model.eagle_config.eagle_aux_hidden_state_layer_ids)
        target = model.config.to_dict()
        own = model.eagle_module.state_dict()
        tensors = dict(head.tensors)
        d2t = tensors.pop("d2t", None)
        if "lm_head.weight" not in own:  # a full-vocab head drafts through the target's LM head
            tensors.pop("lm_head.weight", None)
        missing = sorted(k for k in own if k not in tensors and k != "d2t")
        extra = sorted(k for k in tensors if k not in own)
        wrong = sorted(k for k in tensors if k in own and tuple(tensors[k].shape) != tuple(own[k].shape))
        if missing or extra or wrong:
            first = (missing or extra or wrong)[0]
            raise InputError(f"--init-head {self.path} does not fit the head attached to this target ({first} is "
                             f"{'missing' if missing else 'unexpected' if extra else 'of another shape'}); give a "
                             "head made for this model")
        with torch.no_grad():
            for name, value in tensors.items():
                own[name].copy_(value.to(own[name].dtype))
        return None if d2t is None or self.draft_vocab_size in (None, target.get("vocab_size")) else d2t


def open_init_head(path: str | Path | None, trains: bool, brings_own: bool, draft_vocab_size: int | None = None,
                   intermediate_size: int | None = None) -> tuple[InitHead | None, int | None, int | None]:
    """(the --init-head dir or None, the draft vocab size, the head width): the head's config checked before anything
    slow runs, and convert's two size options filled in from it (`InitHead.fill`); as given without one. `trains`:
    convert trains a head; `brings_own`: --head or --draft-model supply the draft instead."""
    if path is None:
        return None, draft_vocab_size, intermediate_size
    if brings_own or not trains:
        raise InputError("--init-head is where training starts: add --steps N or --epochs N with --data (and no "
                         "--head or --draft-model)")
    path = Path(path).expanduser()
    if not (path / CONFIG).is_file() or not (path / WEIGHTS).is_file():
        raise InputError(f"--init-head '{path}' must be a head dir with {CONFIG} and {WEIGHTS} (a heads/ dir or a "
                         "checkpoint's draft/)")
    try:
        config = json.loads((path / CONFIG).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(f"--init-head {path / CONFIG} cannot be read ({e}); give a head dir") from None
    if not isinstance(config, dict):
        raise InputError(f"--init-head {path / CONFIG} is not a JSON object; give a head dir")
    init = InitHead(path, config)
    return (init, *init.fill(draft_vocab_size, intermediate_size))
