"""The trainer on torch.distributed, by what each part does:
  * loop/       -- configuration, data, optimizer, the training loop and its launcher;
  * resilience/ -- checkpoints, fault injection, anomaly guards, the cross-replica check, the watchdog;
  * measure/    -- memory and metrics, the closed-loop report, pipeline traces, calibration.
"""
