"""`deepspeed`: the DeepSpeed engine (ZeRO 0-3, optional CPU offload), config from flags.

DeepSpeed is imported only inside methods: `import dalle_dist` and `--help` never load it.
The config is built from our flags, then a --deepspeed_config JSON is merged over it; the
batch arithmetic is checked before DeepSpeed sees it. No `amp` block is ever written
(DeepSpeed >= 0.19.7 rejects it).

Precision, as on the other backends: matmuls in 16 bit, LayerNorm, the logits' softmax and
the loss in fp32, the optimizer updating fp32 weights (DeepSpeed 0.19.x, as read and run):

- bf16: DeepSpeed's `torch_autocast` section, its `bf16` section off. The module stays
  fp32 and its forward runs under torch.autocast(bf16) inside DeepSpeed's engine, so it
  computes what DDP's bf16 computes. The fp32 parameters are the master weights (ZeRO 1-3
  partition them; no 16-bit copy is kept), gradients are fp32, and they are reduced in
  fp32 (`lower_precision_safe_modules` empty: DeepSpeed would otherwise reduce, and at
  ZeRO-3 gather, Linear and Conv weights in bf16), as DDP and FSDP's reduce_dtype do.
  bf16 needs no loss scaling. The `bf16` section instead casts the whole module to bf16
  (norms, softmax and loss included) and keeps fp32 master weights in its optimizer.
- fp16: DeepSpeed's `fp16` section (the module in fp16; fp32 master weights in its
  optimizer; its dynamic loss scaler, which skips a step with an inf or nan gradient on
  every rank alike) with the forward run under torch.autocast(fp16) by us
  (`_autocast_forward`), so autocast's fp32 ops (LayerNorm, softmax, cross_entropy) compute
  in fp32; only the embeddings and the residual stream stay fp16, where DDP's are fp32.
  Not `torch_autocast` with fp16: there ZeRO 1-3 steps through a torch GradScaler of each
  rank's own partition, measures the gradient norm on the scaled gradients, reports it
  scaled (x 65536) and clips with it, so a binding --clip_grad_norm divides the step by the
  scale twice (seen on 0.19.8); nor could ranks be sure to agree on a skipped step.
  The forward is wrapped inside the module: DeepSpeed turns an autocast entered around its
  engine off unless its own `torch_autocast` is on.
- fp32: neither.

A --deepspeed_config JSON may tune these sections (fp16's loss scale settings,
torch_autocast's lower_precision_safe_modules, ...) but not choose the precision: an
`enabled` in its bf16 / fp16 / torch_autocast section, or a torch_autocast `dtype`, other
than what --precision writes is refused with one line.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import os
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from dalle_dist.backends.ema import EMAEntry
from dalle_dist.backends.engine import (
    Engine,
    OptimizerFactory,
    SchedulerFactory,
    parameter_digest,
)
from dalle_dist.backends.plan_terms import PlanTerms
from dalle_dist.backends.precision import Precision
from dalle_dist.backends.precision_kinds import PrecisionKind
from dalle_dist.backends.torch_dist import TorchDistributedBackend
from dalle_dist.backends.verdict import Verdict, error_line, installed_version
from dalle_dist.backends.watch import CollectiveWatch
from dalle_dist.errors import ConfigError
from dalle_dist.fileio import quiet_output
from dalle_dist.model.init import WeightStream, owned_parameters, placed, with_heads


def read_json_config(path: str) -> dict[str, Any]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"--deepspeed_config {path} does not exist", "check the path") from None
    except OSError as exc:
        raise ConfigError(f"--deepspeed_config {path} cannot be read ({exc.strerror})") from None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--deepspeed_config {path} is not valid JSON (line {exc.lineno}: "
                          f"{exc.msg})", "fix the file or drop the flag") from None
    if not isinstance(config, dict):
        raise ConfigError(f"--deepspeed_config {path} must hold a JSON object")
    return config


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


#: torch_autocast's dtype for each precision it runs (DeepSpeed reads the name).
_AUTOCAST_DTYPES = {"bf16": "bfloat16"}
#: The names DeepSpeed accepts for a dtype (its DtypeEnum), by our precision name.
_DTYPE_ALIASES = {"bf16": {"bf16", "bfloat16", "torch.bfloat16"},
                  "fp16": {"fp16", "float16", "half", "torch.float16"},
                  "fp32": {"fp32", "float32", "float", "torch.float32"}}


def precision_sections(precision: str) -> dict[str, dict[str, Any]]:
    """The config sections that choose DeepSpeed's precision, for --precision `precision`
    (the module docstring says why these)."""
    autocast: dict[str, Any] = {"enabled": precision in _AUTOCAST_DTYPES}
    if autocast["enabled"]:
        autocast |= {"dtype": _AUTOCAST_DTYPES[precision], "lower_precision_safe_modules": []}
    return {"bf16": {"enabled": False}, "fp16": {"enabled": precision == "fp16"},
            "torch_autocast": autocast}


def check_json_precision(json_config: dict[str, Any], precision: str) -> None:
    """A --deepspeed_config may set the precision sections' other keys, not the precision:
    each `enabled` it sets, and torch_autocast's `dtype`, must be what --precision writes."""
    ours = precision_sections(precision)
    for section, mine in ours.items():
        theirs = json_config.get(section)
        if not isinstance(theirs, dict):
            continue
        if "enabled" in theirs and theirs["enabled"] != mine["enabled"]:
            said = json.dumps(theirs["enabled"])
            raise ConfigError(
                f"--deepspeed_config sets {section}.enabled {said}, but --precision "
                f"{precision} runs DeepSpeed with {section}.enabled "
                f"{json.dumps(mine['enabled'])}",
                f"drop {section}.enabled from the JSON and choose the precision with "
                "--precision")
        if section == "torch_autocast" and "dtype" in theirs and not (
                mine["enabled"] and str(theirs["dtype"]) in _DTYPE_ALIASES[precision]):
            raise ConfigError(
                f"--deepspeed_config sets torch_autocast.dtype {theirs['dtype']}, but "
                f"--precision {precision} writes "
                f"{mine.get('dtype', 'no torch_autocast')}",
                "drop torch_autocast.dtype from the JSON and choose the precision with "
                "--precision")


def _autocast_forward(module: nn.Module, device: torch.device, dtype: torch.dtype) -> None:
    """Run `module`'s forward under torch.autocast(dtype), from inside: DeepSpeed's engine
    turns off an autocast entered around it (Lightning and Accelerate wrap forward alike).
    The instance attribute leaves the state_dict as it is."""
    forward = module.forward

    @functools.wraps(forward)
    def autocast_forward(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device.type, dtype=dtype):
            return forward(*args, **kwargs)

    module.forward = autocast_forward  # type: ignore[method-assign]


def _innermost_torch_optimizer(optimizer: Any) -> torch.optim.Optimizer | None:
    """DeepSpeed wraps the torch optimizer (ZeRO, bf16); schedulers need the torch one."""
    seen = 0
    while not isinstance(optimizer, torch.optim.Optimizer) and seen < 5:
        optimizer = getattr(optimizer, "optimizer", None)
        seen += 1
    return optimizer if isinstance(optimizer, torch.optim.Optimizer) else None


class DeepSpeedEngine(Engine):
    """DeepSpeed clips (gradient_clipping) and zeroes gradients inside its own step, and
    keeps its optimizer partitions in its own checkpoint format. Its forward runs in the
    precision DeepSpeed was configured for (module docstring), so the Engine's own
    precision is fp32: no autocast around it, no GradScaler."""

    has_native_checkpoint = True

    def __init__(self, ds_engine: Any, scheduler: Any, stage: int, device: torch.device,
                 is_root: bool, watch: CollectiveWatch | None = None) -> None:
        super().__init__(ds_engine.module, ds_engine.optimizer, scheduler,
                         Precision("fp32", device), is_root=is_root, watch=watch,
                         ga_steps=int(ds_engine.gradient_accumulation_steps()))
        self.ds_engine, self.stage = ds_engine, stage
        self.shards_parameters = stage == 3
        #: DeepSpeed's engine reports the norm its optimizer wrapper computed
        #: (`_global_grad_norm`); a plain torch optimizer (ZeRO 0 in fp32 or bf16) has none.
        self._reports_norm = hasattr(ds_engine.optimizer, "_global_grad_norm")

    def _wrapped_forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.ds_engine(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._wrapped_forward(*args, **kwargs)  # in DeepSpeed's precision (see above)

    def micro_batch(self, last: bool) -> AbstractContextManager[None]:
        """DeepSpeed finds the accumulation boundary itself (it counts its step() calls
        against gradient_accumulation_steps): nothing to switch."""
        self._last_micro = last
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        """DeepSpeed divides the loss by gradient_accumulation_steps itself. Its step()
        must follow every backward, a window's earlier micro-batches included: there it
        only counts the micro-batch (the boundary's comes in clip_and_step)."""
        self.ds_engine.backward(loss)
        if not self._last_micro:
            self.ds_engine.step()

    def clip_grad_norm(self, max_norm: float | None) -> torch.Tensor | None:
        return None  # done in step() by DeepSpeed, from the config's gradient_clipping

    def clip_and_step(self, max_norm: float | None) -> torch.Tensor | None:
        """DeepSpeed clips inside its step and reports the pre-clip norm its optimizer
        wrapper computed, as a tensor or a Python float (DeepSpeed 0.19.x):

        - ZeRO 1-2 (DeepSpeedZeroOptimizer, CPU offload too) and ZeRO 3: a device tensor
          (ZeRO 3's float64); None when zero_optimization.compute_grad_norm is off.
        - BF16_Optimizer (its bf16 section, which we no longer write): a device tensor.
        - FP16_Optimizer and FP16_UnfusedOptimizer (ZeRO 0 with the fp16 section): a
          float (DeepSpeed's own math.sqrt read it from the device).
        - Any of them after an overflow (fp16, or bf16's check_grad_overflow): float inf.
        - A plain torch optimizer (ZeRO 0 in fp32 or bf16): nothing. There the averaged
          gradients are whole on every rank after backward, so the norm is taken before
          the step zeroes them.

        A float is filled into a device tensor (torch.full: a fill, not a host-to-device
        copy); a tensor is never read on the host."""
        dense = None
        if not self._reports_norm:
            grads = [p.grad for p in self.module.parameters() if p.grad is not None]
            dense = torch.nn.utils.get_total_norm(grads) if grads else None
        self.ds_engine.step()
        reported = self.ds_engine.get_global_grad_norm() if self._reports_norm else None
        if reported is None:
            return dense
        if isinstance(reported, torch.Tensor):
            return reported.detach()
        return torch.full((), reported, dtype=torch.float32, device=self.precision.device)

    def step(self) -> None:
        self.ds_engine.step()

    def zero_grad(self) -> None:
        pass

    @property
    def lr(self) -> float:
        return float(self.ds_engine.get_lr()[0])

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        if self.stage == 3:
            state = self.ds_engine._zero3_consolidated_16bit_state_dict()
            return state if self.is_root else None
        return self.module.state_dict()

    def optimizer_state_dict(self) -> dict[str, Any] | None:
        return None  # partitioned: it lives in the DeepSpeed checkpoint directory

    def rank_digest(self) -> str:
        if self.stage != 3:
            return super().rank_digest()
        # ZeRO-3: this rank's own partition of each parameter (see FSDPEngine.rank_digest).
        return parameter_digest({name: param.ds_tensor
                                 for name, param in self.module.named_parameters()})

    def _ema_layout(self) -> tuple[list[EMAEntry], Any]:
        """Flat at every stage (ema.py: saves that read the same whatever the stage).
        ZeRO-3: each rank averages its own partition of each parameter, `ds_tensor` less
        DeepSpeed's padding, as Shard(0) of the flat parameter over all ranks; ZeRO 0-2:
        the module's whole parameters (16-bit in bf16 and fp16: the fp32 master copies
        are partitions inside the optimizer)."""
        named = list(self.module.named_parameters())
        params = [p for _, p in named]
        if self.stage != 3:
            return [EMAEntry(name, p.shape, flat=True) for name, p in named], lambda: params
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard

        rank, world = dist.get_rank(), dist.get_world_size()
        mesh = init_device_mesh(self.precision.device.type, (world,))
        entries = [EMAEntry(name, torch.Size(p.ds_shape), mesh, (Shard(0),), flat=True)
                   for name, p in named]

        def partitions() -> list[torch.Tensor]:
            parts = []
            for p in params:
                size = p.ds_tensor.numel()
                valid = max(0, min(size, p.ds_numel - rank * size))
                parts.append(p.ds_tensor.view(-1).narrow(0, 0, valid))
            return parts

        return entries, partitions

    @property
    def ema_swaps(self) -> bool:
        """ZeRO-3 never has the EMA written into its partitions: DeepSpeed keeps gathered
        copies of them (persistent small parameters, its parameter-fetch trace) that such
        a write leaves on other values, and a run that did diverged from the one
        process's after its first sample grid (through GatheredParameters it broke the
        fetch trace instead). Its grids and fidelity check are drawn from a model loaded
        with the gathered EMA; its validation measures the trained weights."""
        return self.stage != 3

    def training_state(self) -> dict[str, Any]:
        """The scheduler and the ZeRO stage (DeepSpeed keeps its loss scale in its own
        files)."""
        scheduler = self.scheduler.state_dict() if self.scheduler is not None else None
        return {"scheduler": scheduler, "zero_stage": self.stage}

    def save_native(self, directory: Path, tag: str, client_state: dict[str, Any]) -> None:
        """DeepSpeed's tag folder; `latest` is left to the caller, written once all is
        complete."""
        self.ds_engine.save_checkpoint(str(directory), tag=tag, client_state=client_state,
                                       save_latest=False)

    def load_native(self, directory: Path, tag: str, universal: bool = False) -> bool:
        """Weights, optimizer partitions and DeepSpeed's own state; our scheduler is
        restored from our metadata (load_training_state).

        universal: a universal checkpoint (checkpoint/deepspeed_dir.universal_tag), read
        at this run's world size. DeepSpeed consults its `checkpoint.load_universal`
        setting only inside load_checkpoint, so it is set here, for this load, rather
        than in the config of every run."""
        self.ds_engine._config.load_universal_checkpoint = universal
        loaded, _ = self.ds_engine.load_checkpoint(str(directory), tag=tag,
                                                   load_lr_scheduler_states=False)
        return loaded is not None

    def load_training_state(self, payload: dict[str, Any]) -> str | None:
        """The scheduler. A DeepSpeed directory (`ds_dir`) restores the rest through
        load_native; a single file brings weights (loaded before wrapping) but no
        optimizer state for ZeRO."""
        if self.scheduler is not None and payload.get("scheduler"):
            self.scheduler.load_state_dict(payload["scheduler"])
        if "ds_dir" in payload or payload.get("step", 0) == 0:
            return None
        return ("DeepSpeed keeps its optimizer state in its own directory, and this "
                "checkpoint is a single file")


def zero3_partitioned(module: nn.Module, weights: WeightStream, config: dict[str, Any],
                      device: torch.device) -> nn.Module:
    """A meta-built module under ZeRO-3, partitioned as if built inside
    `deepspeed.zero.Init`: module by module, its parameters get their full values on the
    rank's device and are partitioned at once (`zero.Init(module=...)`), so a rank holds
    its partitions plus one module's full parameters, never the whole model.

    The stream follows `named_parameters()`, which lists a module's own parameters
    together, so each owning module is converted once its last one is filled."""
    from deepspeed.runtime.zero.partition_parameters import Init

    owners = {name: (owner, own) for name, owner, own in owned_parameters(module)}
    filling: nn.Module | None = None  # the module whose parameters are being filled

    def partition(owner: nn.Module) -> None:
        Init(module=owner, config_dict_or_path=config, mem_efficient_linear=False)

    for name, value in weights:
        owner, own = owners.pop(name)
        if owner is not filling:
            if filling is not None:
                partition(filling)
            filling = owner
        meta = owner._parameters[own]
        # No copy where the value already is (the CPU): the partition copies this rank's
        # part out of it, and a checkpoint's memory-mapped value is read only there.
        owner._parameters[own] = nn.Parameter(value.to(device),
                                              requires_grad=meta.requires_grad)
    if filling is not None:
        partition(filling)
    if owners:
        raise RuntimeError(f"no value for {sorted(owners)[:5]}")
    whole = [name for name, param in module.named_parameters() if not hasattr(param, "ds_id")]
    if whole:  # deepspeed.initialize would partition them, from a whole copy on every rank
        raise RuntimeError(f"zero.Init(module=...) left {whole[:5]} unpartitioned")
    return module


def zero3_leaf_blocks(units: Sequence[nn.Module | list[nn.Module]]) -> None:
    """Each transformer block (each of `units`, the task's shard units, or each block of a
    group that shares modules) a ZeRO-3 leaf module, before deepspeed.initialize registers
    its hooks: DeepSpeed then gathers a block's parameters in hooks on the block's own call
    and hooks none of its layers, so a block compiled whole (train --compile) holds no
    hook. A block's weights are gathered at once, the unit `dalle-dist plan` already
    counts for ZeRO-3."""
    from deepspeed.utils import set_z3_leaf_module

    for unit in units:
        for block in unit if isinstance(unit, list) else [unit]:
            set_z3_leaf_module(block, True)


class DeepSpeedBackend(TorchDistributedBackend):
    name = "deepspeed"
    extra = "deepspeed"
    has_native_checkpoint = True
    saves_sharded = False  # its own directory instead (checkpoint/formats.py: native)
    launch_hint = "deepspeed --num_gpus N --module dalle_dist train --deepspeed"
    # bf16 keeps the module fp32 under autocast; fp16 casts it (its fp16 section), module
    # docstring.
    plan_terms = PlanTerms("DeepSpeed ZeRO-{stage}", cost_rank=(3, 4, 5, 7),
                           zero_stages=(0, 1, 2, 3), sharding="zero", casts_model=("fp16",))
    stage: ClassVar[int]
    #: train --compile compiles the transformer blocks (prepare_compiled_blocks)
    compiled_blocks = False

    @classmethod
    def verdict(cls, cuda: bool) -> Verdict:
        verdict = super().verdict(cuda)
        if not verdict.usable:
            return verdict
        try:
            with quiet_output():
                import deepspeed  # noqa: F401
        except Exception as exc:
            return Verdict(False, f"DeepSpeed is not importable ({error_line(exc)})",
                           f"pip install 'dalle_dist[{cls.extra}]'")
        return Verdict(True)

    @classmethod
    def precision_verdict(cls, precision: PrecisionKind, cuda: bool) -> Verdict:
        if precision.dtype is torch.float16 and not cuda:
            return Verdict(False, "DeepSpeed cannot train fp16 on CPU", "use --precision bf16")
        return super().precision_verdict(precision, cuda)

    @classmethod
    def engine_facts(cls) -> dict[str, Any]:
        """Version, accelerator, and for each op whether it is prebuilt or could be built
        just in time (asked as ds_report asks; nothing is built)."""
        facts: dict[str, Any] = {"installed": importlib.util.find_spec("deepspeed") is not None,
                                 "version": installed_version("deepspeed"), "importable": False,
                                 "error": None, "accelerator": None, "ops": {},
                                 "sparse_attention": None}
        if not facts["installed"]:
            return facts
        try:
            with quiet_output():
                import deepspeed  # noqa: F401
                from deepspeed.accelerator import get_accelerator
                from deepspeed.git_version_info import installed_ops
                from deepspeed.ops.op_builder.all_ops import ALL_OPS
                from deepspeed.ops.op_builder.builder import probe_is_compatible

                facts["accelerator"] = get_accelerator()._name
                facts["ops"] = {name: {"prebuilt": bool(installed_ops.get(name, False)),
                                       "compatible": bool(probe_is_compatible(builder, False))}
                                for name, builder in sorted(ALL_OPS.items())}
        except Exception as exc:  # a broken install raises anything
            facts["error"] = error_line(exc)
            return facts
        facts["importable"] = True
        has_sparse = "sparse_attn" in facts["ops"]
        facts["sparse_attention"] = (
            "present (not used: dalle_dist's sparse pattern runs on SDPA)" if has_sparse else
            f"absent: DeepSpeed {facts['version']} ships no sparse attention op (removed in "
            "0.19.7); --attn_types sparse runs on torch SDPA with the same block layout")
        return facts

    def shutdown(self) -> None:
        """Also remove this rank's shared-memory all-reduce buffers: DeepSpeed's CPU comm
        op creates /dev/shm/deepspeed_allreduce_buffer_*_ADDR_PORT_RANK and never unlinks
        them (RAM that stays taken until reboot, per rank and per run; the size seen:
        docs/benchmarks.md, "Failures and hangs")."""
        super().shutdown()
        addr, port = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
        for leftover in Path("/dev/shm").glob(
                f"deepspeed_allreduce_buffer_*_{addr}_{port}_{self.rank}"):
            leftover.unlink(missing_ok=True)

    def init_process_group(self, device: torch.device) -> None:
        import deepspeed

        # On CPU DeepSpeed would pick oneCCL; gloo is what torch ships.
        deepspeed.init_distributed(dist_backend="nccl" if device.type == "cuda" else "gloo",
                                   auto_mpi_discovery=False, verbose=False,
                                   timeout=self.engine_timeout)

    # -- config ------------------------------------------------------------------------

    def build_config(self, batch_size: int, clip_grad_norm: float | None) -> dict[str, Any]:
        """Our flags as a DeepSpeed config, the JSON merged over it, batch numbers checked."""
        args = self.settings
        if args.ga_steps <= 0:
            raise ConfigError(f"--ga_steps must be positive, got {args.ga_steps}")
        zero: dict[str, Any] = {"stage": args.zero_stage}
        if args.zero_stage == 3:
            zero["stage3_gather_16bit_weights_on_model_save"] = True
        if args.zero_offload == "cpu":
            if args.zero_stage == 0:
                raise ConfigError("--zero_offload cpu needs ZeRO", "add --zero_stage 1, 2 or 3")
            zero["offload_optimizer"] = {"device": "cpu"}
        config: dict[str, Any] = {
            "train_batch_size": batch_size,
            "gradient_accumulation_steps": args.ga_steps,
            "gradient_clipping": clip_grad_norm or 0.0,
            "zero_optimization": zero,
            **precision_sections(self.precision_name),
            "steps_per_print": 2**31 - 1,  # our loop logs; DeepSpeed's own lines are noise
            "zero_allow_untested_optimizer": True,
            "zero_force_ds_cpu_optimizer": False,
        }
        self.json_config: dict[str, Any] = {}
        if args.deepspeed_config:
            self.json_config = read_json_config(args.deepspeed_config)
            for key in ("train_batch_size", "gradient_accumulation_steps"):
                ours = config[key]
                theirs = self.json_config.get(key, ours)
                if theirs != ours:
                    flag = "--batch_size" if key == "train_batch_size" else "--ga_steps"
                    raise ConfigError(
                        f"--deepspeed_config sets {key} {theirs} but {flag} is {ours}",
                        f"make them agree: drop {key} from the JSON or pass {flag} {theirs}")
            if "amp" in self.json_config:
                raise ConfigError("--deepspeed_config has an 'amp' block, which DeepSpeed "
                                  "no longer accepts", "remove it and use --precision bf16")
            check_json_precision(self.json_config, self.precision_name)
            config = _merge(config, self.json_config)
        micro = config.get("train_micro_batch_size_per_gpu")
        ga, world = config["gradient_accumulation_steps"], self.world_size
        if micro is None:
            if batch_size % (ga * world):
                raise ConfigError(
                    f"--batch_size {batch_size} (DeepSpeed's train_batch_size) is not "
                    f"divisible by --ga_steps {ga} x {world} ranks",
                    f"use --batch_size {max(1, batch_size // (ga * world)) * ga * world}")
            micro = batch_size // (ga * world)
            config["train_micro_batch_size_per_gpu"] = micro
        if micro * ga * world != batch_size:
            raise ConfigError(
                f"train_batch_size {batch_size} != micro batch {micro} x --ga_steps {ga} x "
                f"{world} ranks ({micro * ga * world})",
                f"set --batch_size {micro * ga * world} or change "
                "train_micro_batch_size_per_gpu in --deepspeed_config")
        return config

    def check_config(self, batch_size: int) -> None:
        super().check_config(batch_size)
        self.config = self.build_config(batch_size, self.settings.clip_grad_norm)

    def prepare_compiled_blocks(self) -> None:
        """ZeRO-3 gathers each layer's weights in forward hooks on every submodule, which
        DeepSpeed marks torch.compiler.disable: a compiled block would break at its first
        layer (seen with DeepSpeed 0.19). So under --compile distribute makes each
        transformer block a ZeRO-3 leaf module (zero3_leaf_blocks): its gathers move onto
        the block's own call, outside the compiled graph, as FSDP2's do."""
        self.compiled_blocks = True

    def rank_batch_size(self, batch_size: int) -> int:
        return int(self.config["train_micro_batch_size_per_gpu"])

    def distribute(self, module: nn.Module, make_optimizer: OptimizerFactory,
                   make_scheduler: SchedulerFactory,
                   shard_units: Sequence[nn.Module | list[nn.Module]] = (),
                   clip_grad_norm: float | None = None,
                   weights: WeightStream | None = None) -> Engine:
        import deepspeed

        config = dict(self.config)
        config["gradient_clipping"] = (self.json_config.get("gradient_clipping")
                                       or clip_grad_norm or 0.0)
        device = self.device
        if weights is not None and int(config["zero_optimization"]["stage"]) == 3:
            heads: dict[str, bytes] = {}
            module = zero3_partitioned(module, with_heads(weights, heads), config, device)
            self.check_same_weights(heads)
        else:
            module = placed(module, weights, device)
        if config["fp16"]["enabled"]:
            _autocast_forward(module, device, torch.float16)
        if self.compiled_blocks and int(config["zero_optimization"]["stage"]) == 3:
            zero3_leaf_blocks(shard_units)
        optimizer = None
        if "optimizer" in config:
            self.warn("--deepspeed_config defines an optimizer: it replaces dalle_dist's Adam")
        else:
            optimizer = make_optimizer(module.parameters())
        ds_engine, ds_optimizer, _, ds_scheduler = deepspeed.initialize(
            model=module, optimizer=optimizer, model_parameters=None if optimizer else
            [p for p in module.parameters() if p.requires_grad], config=config)
        scheduler = None
        if ds_scheduler is not None or "scheduler" in config:
            self.warn("--deepspeed_config defines a scheduler: it replaces dalle_dist's")
        else:
            inner = optimizer or _innermost_torch_optimizer(ds_optimizer)
            scheduler = make_scheduler(inner) if inner is not None else None
        return DeepSpeedEngine(ds_engine, scheduler, int(config["zero_optimization"]["stage"]),
                               device, self.is_root, self.watch)

    def warn(self, message: str) -> None:
        if self.is_root:
            print(f"warning: {message}", flush=True)
