"""llm-gpu-exporter: NVIDIA GPU metrics read through NVML, served for Prometheus."""
