"""Dynamic Resource Allocation, pure: the devices this node publishes (names, attributes,
ResourceSlices), NVIDIA's opaque config, and the claims the kubelet asks to prepare."""
