"""A training loop that swallows every exception, the tracer's stop included (`while True:`
around a bare `except:`): the tracer must end it, with the reason."""

import torch

m = torch.nn.Linear(8, 8).cuda()
opt = torch.optim.SGD(m.parameters(), lr=0.1)
while True:
    try:
        m(torch.randn(4, 8, device="cuda")).sum().backward()
        opt.step()
        opt.zero_grad()
    except:  # noqa: E722
        pass
