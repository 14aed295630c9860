"""Source portraits: placeholder drawings, the FairFace sampler and its pre-screen."""
