"""Getting models out: capture (torch.export), the dist/ folder, and server layouts."""
