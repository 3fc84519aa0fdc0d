"""The trained policy out of a run: loaded from a checkpoint (`loaded`), played greedily or
sampled for evaluation (`acting`, `evaluation`), recorded as a video (`video`), and exported as
TorchScript or ONNX with the metadata a serving stack needs (`export`)."""
