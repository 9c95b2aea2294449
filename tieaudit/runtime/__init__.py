"""ONNX Runtime: probe in a child process, optimized-graph analysis, measurement, and export."""
