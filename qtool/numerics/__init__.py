"""What a bit-exactness reviewer audits: quantization parameters, rescales, activation tables, the
integer cell's primitives, int32 lanes and the interval proof, the float and fake-quant references,
the passes over a quantized model, and the validation of one."""
