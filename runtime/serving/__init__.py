"""Running the real servers on what a build wrote: the Triton Inference Server binary ``nvidia-pytriton`` ships."""
