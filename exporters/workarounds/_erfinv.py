"""Giles' single-precision erfinv polynomial (central and tail branches), shared by the ONNX
translation and the ExecuTorch node fix that both compute ``erfinv`` from it."""

# Giles (2010), "Approximating the erfinv function": single-precision coefficients, relative error
# below 4e-7 on (-1, 1); the central branch for w < 5, the tail branch otherwise.
_ERFINV_CENTRAL = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
                   -0.00125372503, -0.00417768164, 0.246640727, 1.50140941)
_ERFINV_TAIL = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
                -0.0076224613, 0.00943887047, 1.00167406, 2.83297682)
