"""fp16 training that diverged (category fp16-overflow), and the loss scaler's harmless
warm-up notes.

A collapsed loss scale is a root cause: its entries rank first of all (100s), before the
CUDA and NCCL errors that follow it. fp16-nan-loss (1100) ranks before nan-loss (other,
1420), which reads the same lines: with fp16 on in the log, a NaN loss line is fp16's.
The warm-up notes (1500s) are harmless; the same lines become a failure only through the
sequences above, when the scale reaches its floor.
"""

from __future__ import annotations

from dalle_dist.doctor.signatures.base import BENIGN, NAN_LOSS, Signature

# Context for entries that only mean fp16 trouble when fp16 was on.
_FP16_ON = (r"--precision[ =]fp16", r"--fp16\b", r"--amp\b", r"fp16_enabled\W+True",
            r'"fp16":\s*\{\s*"enabled":\s*true', r"Attempted loss scale",
            r"Gradient overflow\.", r"torch\.float16", r"opt_level",
            # mmcv/mmengine configs; torch's own AMP (GradScaler is for fp16 only)
            r"(?<![\w.])fp16\s*=\s*dict\(", r"Fp16OptimizerHook", r"AmpOptimWrapper",
            r"GradScaler\(", r"\bscaler\.scale\(",
            # CUDA autocast runs in fp16 unless given another dtype (its deprecation
            # warning names it too)
            r"cuda\.amp\.autocast\((?![^)]*bfloat16)",
            # a config, script or log file named for fp16 (mmdetection's
            # configs/fp16/*_fp16_*.py, a user's train_fp16.log)
            r"(?i)(?<![a-z0-9])fp16(?![a-z0-9])[\w./-]*\.(?:py|sh|ya?ml|json|txt|log|cfg)\b")
# A number as loss scalers print it: 65536, 65536.0, 0.5, 3.0517578125e-05.
_SCALE = r"(?P<scale>\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)"
# The floor below which a dynamic loss scale means fp16 training has diverged.
SCALE_FLOOR = 8.0
# A logged loss-scale column decides only below 1: bf16 and fp32 runs of some frameworks
# (Megatron) print a static `loss scale: 1.0` every step; an exact 0 is the "dynamic"
# setting in DeepSpeed, Apex and transformers configs, never a value the scaler reached.
LOSS_SCALE_COLUMN_FLOOR = 0.5

SIGNATURES: tuple[Signature, ...] = (
    Signature(
        "ds-loss-scale-at-minimum", "fp16-overflow",
        (r"Current loss scale already at minimum",
         r"Minimum loss scale reached",
         r"\[deepspeed\] OVERFLOW! Rank \d+ Skipping step\. Attempted loss scale: [12], "
         r"reducing to 1\b"),
        "DeepSpeed's fp16 loss scale fell to its minimum: gradients overflow at every scale, "
        "so fp16 training has diverged (not the harmless early overflows)",
        "train in bf16 (--precision bf16) if the GPU has it; else lower the learning rate, "
        "keep --clip_grad_norm, add warmup, and resume from a checkpoint before the collapse",
        "grep -c 'OVERFLOW' LOGFILE",
        priority=100),
    # Sequences: the scale halved step after step down to single digits.
    Signature(
        "apex-loss-scale-collapse", "fp16-overflow",
        (r"Gradient overflow[.,]?\s+[Ss]kipping step,? loss scaler \d+ reducing loss "
         r"scale to " + _SCALE,),
        "Apex amp halved the loss scale overflow after overflow down to {scale}: gradients "
        "overflow at every scale, fp16 training has diverged",
        "train in bf16 (--precision bf16), or lower the learning rate and keep "
        "--clip_grad_norm; resume from a checkpoint before the collapse",
        "grep -c 'Gradient overflow' LOGFILE",
        scale_at_most=SCALE_FLOOR,
        priority=105),
    Signature(
        "ds-loss-scale-collapse", "fp16-overflow",
        (r"(?:OVERFLOW!|[Oo]verflow detected\.|loss scale overflow!)[^\n]*Attempted loss "
         r"scale: [\d.e+-]+, reducing to " + _SCALE,
         r"Reducing dynamic loss scale from [\d.e+-]+ to " + _SCALE,
         r"[Ff]ound overflow[^\n]*(?:[Ll]oss scale|scale) (?:to|:) " + _SCALE,
         # fairseq (and its AMP optimizer); ColossalAI's dynamic grad scaler
         r"(?i)overflow detected, setting (?:loss )?scale to:? " + _SCALE,
         r"(?i)overflow occurs?, the loss scale is adjusted to " + _SCALE,
         # any scaler that says so in words: "decreased loss scale to 4", "reducing the
         # dynamic loss_scale to 0.5"
         r"(?i)\b(?:decreas|reduc|lower)(?:ed|ing) (?:the )?(?:dynamic )?loss[_ ]scale "
         r"(?:to|:) " + _SCALE),
        "the fp16 loss scale was halved overflow after overflow down to {scale}: "
        "gradients overflow at every scale, fp16 training has diverged (not the harmless "
        "warm-up overflows, which stop in the thousands)",
        "train in bf16 (--precision bf16) if the GPU has it; else lower the learning rate, "
        "keep --clip_grad_norm, add warmup, and resume from a checkpoint before the collapse",
        "grep -c -i 'overflow' LOGFILE",
        scale_at_most=SCALE_FLOOR,
        priority=110),
    # guided-diffusion / improved-diffusion (and their forks) keep log2 of the scale: it
    # drops by 1 at each NaN; at 3 or below (a scale of 8 or less) every step overflows.
    Signature(
        "lg-loss-scale-collapse", "fp16-overflow",
        (r"(?i)\b(?:decreas|reduc|lower)(?:ed|ing) (?:the )?lg_loss_scale (?:to|:) "
         r"(?P<scale>-?\d+(?:\.\d+)?)",),
        "the fp16 loss scale (logged as its log2, lg_loss_scale) fell to 2**{scale}: every "
        "step finds NaN gradients and halves it again, fp16 training has diverged",
        "train in fp32 or bf16, or lower the learning rate; resume from a checkpoint before "
        "the collapse",
        "grep -c 'lg_loss_scale' LOGFILE",
        scale_at_most=3.0,
        priority=115),
    Signature(
        "loss-scale-column-collapse", "fp16-overflow",
        (r"(?i)(?<![\w.-])loss[_ ]scale['\"]?[ \t]*[:=|]?[ \t]*(?!0*\.?0*(?![\d.eE]))"
         + _SCALE + r"(?![\w.])",),
        "the logged fp16 loss scale fell to {scale}: the dynamic scaler halved it at every "
        "overflow, so every step overflows and fp16 training has diverged (a static or "
        "healthy scale never drops below 1)",
        "train in bf16 (--precision bf16) if the GPU has it; else lower the learning rate, "
        "keep --clip_grad_norm, add warmup, and resume from a checkpoint before the collapse",
        "grep -n -i 'loss.scale' LOGFILE | tail",
        scale_at_most=LOSS_SCALE_COLUMN_FLOOR,
        priority=120),
    Signature(
        "sampling-nan-probabilities", "fp16-overflow",
        (r"probability tensor contains either `?inf`?, `?nan`? or element < 0",
         r"invalid multinomial distribution \(sum of probabilities <= 0\)",
         r"sampleMultinomialOnce[^\n]*Assertion"),
        "sampling drew from NaN/inf probabilities: the logits overflowed, typically a "
        "model run (or trained) in fp16 beyond its range",
        "generate in bf16 or fp32 (--precision bf16), and check the checkpoint's loss was "
        "finite when it was saved",
        "dalle-dist generate --precision fp32 --text 'a test' --num_images 1",
        priority=125),
    # NaN loss with fp16 on: before nan-loss (other, 1420), which reads the same lines.
    Signature(
        "fp16-nan-loss", "fp16-overflow",
        (NAN_LOSS,
         r"returned nan values in its \d+th output",
         r"Loss became infinite or NaN"),   # detectron2's trainer
        "the loss became NaN with fp16 on: activations or gradients overflowed fp16's range",
        "train in bf16 (--precision bf16) if the GPU has it; else lower the learning rate, "
        "keep --clip_grad_norm, and resume from a checkpoint saved before the NaN",
        "grep -in 'nan' LOGFILE | head",
        requires=_FP16_ON,
        priority=1100),
    Signature(
        "ds-overflow-skip", BENIGN,
        (r"\[deep(?:speed|scale)\] OVERFLOW! (?:Rank \d+ )?Skipping step",
         r"\[deep(?:speed|scale)\] fp16 dynamic loss scale overflow! Skipping step",
         r"Grad overflow on iteration:? \d+",
         r"[Oo]verflow detected\. Skipping step\. Attempted loss scale",
         r"Reducing dynamic loss scale from [\d.e+-]+ to",
         r"[Ff]ound overflow\. Skip step",
         r"(?i)overflow detected, setting (?:loss )?scale to",
         r"(?i)overflow occurs?, the loss scale is adjusted to"),
        "DeepSpeed's dynamic fp16 loss scaler skipped a step and lowered the scale: normal "
        "in the first steps of fp16 training",
        "nothing, unless the scale keeps falling to its minimum (then see fp16-overflow)",
        "grep -c 'OVERFLOW' LOGFILE",
        benign=True,
        priority=1500),
    Signature(
        "apex-gradient-overflow", BENIGN,
        (r"Gradient overflow[.,]?\s+[Ss]kipping step,? loss scaler \d+ reducing loss scale "
         r"to",),
        "Apex amp's dynamic loss scaler skipped a step and halved the scale: normal early "
        "in fp16 training",
        "nothing, unless the scale keeps falling below 1 (then see fp16-overflow)",
        "grep -c 'Gradient overflow' LOGFILE",
        benign=True,
        priority=1505),
)
