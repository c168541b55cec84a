"""demo.py: numalign from Python: a linear layer in bf16, a legitimately reordered version and
a buggy one, captured forward and backward and judged against a float64 truth."""
import torch

import numalign
from numalign import capture


class Linear(torch.nn.Module):
    def __init__(self, mode="reference"):
        super().__init__()
        torch.manual_seed(0)
        self.proj = torch.nn.Linear(64, 32)
        self.mode = mode

    def forward(self, x):
        w, b = self.proj.weight, self.proj.bias
        if self.mode == "chunked":  # fp32 partial sums over 4 chunks: another legitimate order
            acc = sum(x[:, c:c + 16].float() @ w[:, c:c + 16].float().T for c in range(0, 64, 16))
            return (acc + b.float()).to(x.dtype)
        if self.mode == "dropped":  # a real bug: forgets the last column of the reduction
            return x[:, :-1] @ w[:, :-1].T + b
        return torch.nn.functional.linear(x, w, b)


x = torch.randn(16, 64, generator=torch.Generator().manual_seed(1))
truth = capture.run_fwd_bwd(Linear(), (x,), torch.float64, truth_of=torch.bfloat16)
ref = capture.run_fwd_bwd(Linear(), (x,), torch.bfloat16)
print(numalign.judge(capture.run_fwd_bwd(Linear("chunked"), (x,), torch.bfloat16), ref, truth))
print(numalign.judge(capture.run_fwd_bwd(Linear("dropped"), (x,), torch.bfloat16), ref, truth))
