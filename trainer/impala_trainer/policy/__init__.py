"""The trained policy out of a run: loaded from a checkpoint (`loaded`), played greedily or
sampled (`player`), in whole episodes or games (`episodes`, `games`) and spec.evaluation's rounds
of them (`rounds`), recorded as a video (`video`), and exported as TorchScript or ONNX with the
metadata a serving stack needs (`export`)."""
