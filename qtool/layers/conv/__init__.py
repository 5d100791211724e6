"""The convolutions: conv1d over time, conv2d over time x frequency (a feature map)."""
