"""What a run measures and reports beside the prediction: memory and metrics, pipeline traces, and the
calibration that measures this machine's rates."""
