! An outside Fortran program over the installed model library, built with pkg-config alone
! (scripts/test-consumer):
!   gfortran $(pkg-config --variable=fortran_module kfsdp-infer) main.f90 $(pkg-config --libs kfsdp-infer) -o infer-f
!   ./infer-f MODEL.safetensors EXPECTED0 EXPECTED1      (make_model.py writes both)
! The same checks as main.c, through the kfsdp_infer module.
program infer_f
  use, intrinsic :: iso_c_binding, only: c_double
  use kfsdp_infer
  implicit none
  type(kfsdp_model) :: model
  real(c_double) :: x(6, 2), u(2), expected(2)
  character(len=4096) :: path, text
  integer :: in_features, out_features, r, c
  logical :: ok

  if (command_argument_count() /= 3) error stop 'usage: infer-f MODEL.safetensors EXPECTED0 EXPECTED1'
  call get_command_argument(1, path)
  do r = 1, 2
    call get_command_argument(1 + r, text)
    read (text, *) expected(r)
  end do
  ! Column r is row r - 1 of make_model.py's inputs.
  do r = 1, 2
    do c = 1, 6
      x(c, r) = 0.1_c_double * c + 0.3_c_double * (r - 1)
    end do
  end do
  if (kfsdp_load(trim(path), model) /= KFSDP_OK) error stop kfsdp_last_error()
  if (kfsdp_features(model, in_features, out_features) /= KFSDP_OK) error stop kfsdp_last_error()
  if (kfsdp_predict(model, x, u) /= KFSDP_OK) error stop kfsdp_last_error()
  call kfsdp_free(model)
  ! kfsdp's erf and Python's may differ in the last bits.
  ok = in_features == 6 .and. out_features == 1 .and. all(abs(u - expected) <= 1e-12_c_double * abs(expected))
  write (*, '(a, i0, a, i0, a, 2es25.17)', advance='no') 'infer-f: ', in_features, ' -> ', out_features, &
    ' features, predictions', u
  if (.not. ok) then
    write (*, '(a)') ' (FAILED: expected 6 -> 1 and make_model.py''s values)'
    error stop 1
  end if
  write (*, '(a)') ''
end program infer_f
