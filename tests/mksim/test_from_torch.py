"""mksim.models.from_torch: a tiny Llama-like decoder traced on the meta device."""

from __future__ import annotations

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from mksim import models  # noqa: E402
from mksim.errors import WorkloadError  # noqa: E402
from mksim.workload import Input, TaskGraph, Tiling  # noqa: E402

V, H, NH, NKV, HD, I, LAYERS = 256, 128, 4, 2, 32, 256, 2
HF = dict(model_type="llama", vocab_size=V, hidden_size=H, intermediate_size=I, num_hidden_layers=LAYERS,
          num_attention_heads=NH, num_key_value_heads=NKV, head_dim=HD, tie_word_embeddings=False)


class TinyRMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x * torch.rsqrt(var + self.eps)) * self.weight


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = nn.Linear(H, NH * HD, bias=False)
        self.k_proj = nn.Linear(H, NKV * HD, bias=False)
        self.v_proj = nn.Linear(H, NKV * HD, bias=False)
        self.o_proj = nn.Linear(NH * HD, H, bias=False)

    def forward(self, x):
        b, s = x.size(0), x.size(1)
        q = self.q_proj(x).view(b, s, NH, HD).transpose(1, 2)
        k = self.k_proj(x).view(b, s, NKV, HD).transpose(1, 2).repeat_interleave(NH // NKV, dim=1)
        v = self.v_proj(x).view(b, s, NKV, HD).transpose(1, 2).repeat_interleave(NH // NKV, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(o.transpose(1, 2).reshape(b, s, NH * HD))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj = nn.Linear(H, I, bias=False)
        self.up_proj = nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.input_layernorm = TinyRMSNorm(H)
        self.self_attn = Attention()
        self.post_attention_layernorm = TinyRMSNorm(H)
        self.mlp = MLP()

    def forward(self, x):
        h = x + self.self_attn(self.input_layernorm(x))
        return h + self.mlp(self.post_attention_layernorm(h))


class TinyLlama(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(V, H)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = TinyRMSNorm(H)
        self.lm_head = nn.Linear(H, V, bias=False)

    def forward(self, input_ids):
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


@pytest.fixture(scope="module")
def model():
    with torch.device("meta"):
        return TinyLlama()


def ids(b: int, s: int):
    return torch.zeros(b, s, dtype=torch.long, device="meta")


def by_name(wl):
    return {op.name: op for op in wl.ops}


@pytest.mark.slow  # 1.2 s of CPU
def test_op_kinds_and_counts(model):
    wl = models.from_torch(model, ids(2, 1))
    kinds = wl.summary()["op_kinds"]
    assert kinds == {"embed": 1, "rmsnorm": 2 * LAYERS + 1, "matmul": LAYERS * (4 + 3) + 1,
                     "attn_partial": LAYERS, "silu_mul": LAYERS, "add": 2 * LAYERS}
    assert len(wl.ops) == sum(kinds.values())
    assert wl.tokens == wl.batch == 2 and wl.phase == "decode"
    ops = by_name(wl)
    for name in ("embed_tokens", "layers.0.self_attn.q_proj", "layers.1.mlp.down_proj", "norm", "lm_head"):
        assert name in ops
    assert ops["layers.1.self_attn.o_proj"].layer == 1 and ops["lm_head"].layer is None


def test_weight_bytes_are_two_bytes_per_parameter_read(model):
    b, s = 3, 5
    wl = models.from_torch(model, ids(b, s), phase="prefill")
    n_params = sum(p.numel() for p in model.parameters())
    # every parameter is read once, except the embedding table, of which only the rows of
    # the b*s tokens are gathered
    assert wl.weight_bytes == 2 * (n_params - V * H) + 2 * b * s * H
    assert wl.tokens == b * s and wl.prefill_tokens == s
    fp8 = models.from_torch(model, ids(b, s), weight_dtype="fp8")
    mm = lambda w: sum(op.weight_bytes for op in w.ops if op.kind == "matmul")  # noqa: E731
    assert mm(fp8) == mm(wl) / 2 and fp8.weight_bytes - mm(fp8) == wl.weight_bytes - mm(wl)


def test_linear_and_attention_flops(model):
    b, s = 2, 7
    ops = by_name(models.from_torch(model, ids(b, s)))
    q = ops["layers.0.self_attn.q_proj"]
    assert q.kind == "matmul" and q.out_size == NH * HD and q.elem_bytes == b * s * 2
    assert q.flops == 2 * (b * s) * H * (NH * HD)
    assert q.weight_bytes == 2 * H * NH * HD and q.attrs["k"] == H and q.attrs["rows"] == b * s
    (attn,) = [op for op in ops.values() if op.kind == "attn_partial" and op.layer == 0]
    assert attn.out_size == NH and attn.elem_bytes == b * s * HD * 2
    assert attn.flops == 4 * b * NH * HD * (s * (s + 1) // 2)  # causal: QK^T and PV over s(s+1)/2 pairs


def test_dependencies(model):
    wl = models.from_torch(model, ids(2, 1))
    ops = by_name(wl)
    q = ops["layers.0.self_attn.q_proj"]
    assert q.inputs == (Input("layers.0.input_layernorm", full=True),)
    (attn,) = [op for op in wl.ops if op.kind == "attn_partial" and op.layer == 0]
    assert {i.op for i in attn.inputs} == {f"layers.0.self_attn.{p}_proj" for p in "qkv"}
    assert all(i.full for i in attn.inputs)
    assert ops["layers.0.self_attn.o_proj"].inputs == (Input(attn.name, full=True),)
    # the residual add after attention: identity on the embedding and the o projection
    (add,) = [op for op in wl.ops if op.kind == "add" and Input("layers.0.self_attn.o_proj") in op.inputs]
    assert set(add.inputs) == {Input("embed_tokens"), Input("layers.0.self_attn.o_proj")}
    (act,) = [op for op in wl.ops if op.kind == "silu_mul" and op.layer == 0]
    assert set(act.inputs) == {Input("layers.0.mlp.gate_proj"), Input("layers.0.mlp.up_proj")}
    assert ops["layers.0.mlp.down_proj"].inputs == (Input(act.name, full=True),)

    g = TaskGraph(wl, Tiling(default=8))
    g.check_acyclic()
    norm, oproj = wl.index["layers.0.input_layernorm"], wl.index["layers.0.self_attn.o_proj"]
    # a matvec tile needs its whole input; an add tile only the matching half of o_proj
    assert g.deps(g.task_id(q.name, 3)) == ((norm, 0, int(g.n_tiles[norm])),)
    assert g.n_tiles[wl.index[add.name]] == 2 and g.n_tiles[oproj] == 8
    assert (oproj, 4, 8) in g.deps(g.task_id(add.name, 1))


def test_meta_only_and_module_unchanged(model):
    models.from_torch(model, ids(1, 1))
    assert all(p.is_meta for p in model.parameters())
    # a real (CPU) module is copied to meta for tracing; its own weights stay where they are
    real = MLP()
    before = real.up_proj.weight.detach().clone()
    wl = models.from_torch(real, torch.randn(2, H))
    assert not real.up_proj.weight.is_meta and torch.equal(real.up_proj.weight, before)
    assert wl.summary()["op_kinds"] == {"matmul": 3, "silu_mul": 1}


def test_matches_hf_config_builder(model):
    b = 2
    ours = models.from_torch(model, ids(b, 1))
    ref = models.from_hf_config(HF, batch=b, kv_len=16)
    mm = lambda w: sum(op.weight_bytes for op in w.ops if op.kind == "matmul")  # noqa: E731
    assert mm(ours) == mm(ref)
    assert ours.weight_bytes == ref.weight_bytes  # norms and embedding rows as well
    assert sum(op.flops for op in ours.ops if op.kind == "matmul") == pytest.approx(
        sum(op.flops for op in ref.ops if op.kind == "matmul"), rel=0.01)  # ref adds residual FLOPs


def test_direct_parameter_and_leaf_modules():
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.empty(H, 64))
            self.scale = nn.Parameter(torch.empty(64))

        def forward(self, x):
            return (x @ self.w) * self.scale

    with torch.device("meta"):
        wl = models.from_torch(Scaled(), torch.empty(4, H))
    mm, mul = wl.ops
    assert (mm.kind, mm.weight_bytes, mm.flops) == ("matmul", 2 * H * 64, 2 * 4 * H * 64)
    assert mul.weight_bytes == 2 * 64 and mul.inputs == (Input(mm.name),)


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(H, H)

    def forward(self, x):
        if x.sum() > 0:  # data-dependent Python control flow
            return self.lin(x)
        return x


class ShapeBranch(Branchy):
    def forward(self, x):
        if x.shape[-1] == H:  # control flow on a shape: FX cannot trace it, meta tensors can run it
            return self.lin(x)
        return x


class Outer(nn.Module):
    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner
        self.out = nn.Linear(H, 8)

    def forward(self, x):
        return self.out(self.inner(x))


def test_untraceable_module_gives_workload_error():
    with torch.device("meta"):
        outer = Outer(Branchy())
    with pytest.raises(WorkloadError) as err:
        models.from_torch(outer, torch.empty(2, H))
    msg = str(err.value)
    assert "\n" not in msg and "Outer" in msg and "control flow" in msg
    assert "leaf_modules" in msg and "from_hf_config" in msg
    # as a leaf it traces, but its values are not known on meta: still a one-line error
    with pytest.raises(WorkloadError, match=r"meta device failed at node inner \(Branchy: .*meta tensors"):
        models.from_torch(outer, torch.empty(2, H), leaf_modules=[Branchy])


def test_leaf_module_follows_the_advice():
    with torch.device("meta"):
        outer = Outer(ShapeBranch())
    with pytest.raises(WorkloadError, match="could not trace"):
        models.from_torch(outer, torch.empty(2, H))
    wl = models.from_torch(outer, torch.empty(2, H), leaf_modules=[ShapeBranch])
    assert [(op.name, op.kind) for op in wl.ops] == [("inner", "matmul"), ("out", "matmul")]
    assert wl.weight_bytes == 2 * (H * H + H) + 2 * (H * 8 + 8)
    assert wl.ops[0].flops == 2 * 2 * H * H  # counted by running the leaf under torch's FLOP counter
    assert wl.ops[1].inputs == (Input("inner", full=True),)


def test_bad_arguments():
    with pytest.raises(WorkloadError, match="nn.Module"):
        models.from_torch(object(), None)
    with pytest.raises(WorkloadError, match="weight dtype"):
        models.from_torch(MLP(), torch.empty(1, H), weight_dtype="int3")
    with pytest.raises(WorkloadError, match="meta device failed"):
        models.from_torch(MLP(), torch.empty(1, H + 1))  # wrong input width


def test_import_mksim_does_not_import_torch():
    code = "import sys, mksim, mksim.models, mksim.workload; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# -- mixtures of experts: built from their Hugging Face config, not traced ----------------------------------
MOE_CLASSES = {  # model_type: (config class, model class, expert fields)
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(num_local_experts=8, num_experts_per_tok=2,
                                                            intermediate_size=128)),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", dict(num_experts=8, num_experts_per_tok=2, intermediate_size=128)),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", dict(num_experts=8, num_experts_per_tok=2,
                                                                moe_intermediate_size=64, intermediate_size=384,
                                                                shared_expert_intermediate_size=128,
                                                                mlp_only_layers=[0])),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(num_experts=8, num_experts_per_tok=2,
                                                                moe_intermediate_size=128, intermediate_size=384,
                                                                mlp_only_layers=[1], norm_topk_prob=True)),
}


@pytest.mark.slow  # transformers' import, about 3 s
@pytest.mark.parametrize("model_type", sorted(MOE_CLASSES))
def test_a_hugging_face_moe_model_is_built_from_its_config(model_type):
    """The same workload as the config import, and every parameter of the module counted."""
    transformers = pytest.importorskip("transformers")
    conf_cls, model_cls, fields = MOE_CLASSES[model_type]
    conf = getattr(transformers, conf_cls)(hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                                           num_key_value_heads=2, vocab_size=1000, **fields)
    with torch.device("meta"):
        module = getattr(transformers, model_cls)(conf)
    wl = models.from_torch(module, torch.zeros(3, 1, dtype=torch.long))
    assert wl == models.from_hf_config(conf.to_dict(), batch=3) and wl.batch == 3 and wl.routing
    cfg = models.config_from_hf(conf.to_dict())
    assert cfg.param_count() == sum(p.numel() for p in module.parameters())
    pre = models.from_torch(module, torch.zeros(2, 16, dtype=torch.long), phase="prefill")
    assert (pre.tokens, pre.prefill_tokens, pre.kv_len) == (32, 16, 0)


def test_an_moe_module_without_a_config_is_refused_in_one_line():
    class Experts(nn.Module):
        def __init__(self):
            super().__init__()
            self.experts = nn.ModuleList([nn.Linear(8, 8) for _ in range(4)])

        def forward(self, x):
            return self.experts[0](x)

    with pytest.raises(WorkloadError, match=r"Experts is a mixture-of-experts model \(4 experts in experts\) without a "
                                            "Hugging Face config") as exc:
        models.from_torch(Experts(), torch.zeros(1, 8))
    assert "\n" not in str(exc.value)
    deepseek = Experts()
    deepseek.config = {"model_type": "deepseek_v3", "n_routed_experts": 4, "num_experts_per_tok": 2,  # type: ignore
                       "moe_intermediate_size": 8, "hidden_size": 8, "num_attention_heads": 2,
                       "num_hidden_layers": 1, "intermediate_size": 16, "vocab_size": 10, "kv_lora_rank": 4}
    with pytest.raises(WorkloadError, match="its config cannot be built: config: deepseek_v3 uses multi-head latent"):
        models.from_torch(deepseek, torch.zeros(1, 8))
