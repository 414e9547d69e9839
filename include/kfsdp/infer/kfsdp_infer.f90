! kfsdp_infer — a trained kfsdp model's forward from Fortran, over the C API of kfsdp_infer.h
! (iso_c_binding). Link the model's shared library (e.g. libheat_surrogate) that implements it.
!
!   use, intrinsic :: iso_c_binding, only: c_double
!   use kfsdp_infer
!   type(kfsdp_model) :: model
!   real(c_double) :: x(6, n), u(n)                  ! x(:, i): the features of row i
!   if (kfsdp_load('surrogate.safetensors', model) /= KFSDP_OK) error stop kfsdp_last_error()
!   if (kfsdp_predict(model, x, u) /= KFSDP_OK) error stop kfsdp_last_error()
!   call kfsdp_free(model)
!
! A column of x is a row of the C API's row-major inputs: x(features, rows) is passed as it is.
! Every function returns the C API's status (KFSDP_OK or an error code, with kfsdp_last_error()).
module kfsdp_infer
  use, intrinsic :: iso_c_binding, only: c_ptr, c_null_ptr, c_int, c_size_t, c_double, c_char, c_null_char, &
                                         c_associated, c_f_pointer
  implicit none
  private
  public :: kfsdp_model, kfsdp_load, kfsdp_features, kfsdp_predict, kfsdp_free, kfsdp_last_error
  public :: KFSDP_OK, KFSDP_INVALID_ARGUMENT, KFSDP_LOAD_FAILED, KFSDP_KOKKOS_UNAVAILABLE, KFSDP_FAILED

  ! The C API's status codes (kfsdp_infer.h).
  integer(c_int), parameter :: KFSDP_OK = 0, KFSDP_INVALID_ARGUMENT = 1, KFSDP_LOAD_FAILED = 2, &
                               KFSDP_KOKKOS_UNAVAILABLE = 3, KFSDP_FAILED = 4

  ! A loaded model (the C API's kfsdp_model*); null until kfsdp_load succeeds.
  type :: kfsdp_model
    type(c_ptr) :: handle = c_null_ptr
  end type kfsdp_model

  interface
    integer(c_int) function c_load(path, model) bind(C, name='kfsdp_load')
      import :: c_int, c_char, c_ptr
      character(kind=c_char), intent(in) :: path(*)
      type(c_ptr), intent(out) :: model
    end function c_load
    integer(c_int) function c_features(model, in_features, out_features) bind(C, name='kfsdp_features')
      import :: c_int, c_ptr, c_size_t
      type(c_ptr), value :: model
      integer(c_size_t), intent(out) :: in_features, out_features
    end function c_features
    integer(c_int) function c_predict(model, inputs, rows, features, outputs, outputs_length) bind(C, name='kfsdp_predict')
      import :: c_int, c_ptr, c_size_t, c_double
      type(c_ptr), value :: model
      real(c_double), intent(in) :: inputs(*)
      integer(c_size_t), value :: rows, features
      real(c_double), intent(inout) :: outputs(*)
      integer(c_size_t), value :: outputs_length
    end function c_predict
    subroutine c_free(model) bind(C, name='kfsdp_free')
      import :: c_ptr
      type(c_ptr), value :: model
    end subroutine c_free
    type(c_ptr) function c_last_error() bind(C, name='kfsdp_last_error')
      import :: c_ptr
    end function c_last_error
    integer(c_size_t) function c_strlen(text) bind(C, name='strlen')
      import :: c_ptr, c_size_t
      type(c_ptr), value :: text
    end function c_strlen
  end interface

contains

  ! Loads the safetensors file `path` (trailing blanks ignored) into `model`.
  integer(c_int) function kfsdp_load(path, model) result(status)
    character(len=*), intent(in) :: path
    type(kfsdp_model), intent(inout) :: model
    status = c_load(trim(path) // c_null_char, model%handle)
  end function kfsdp_load

  ! Features a row of inputs has (size(inputs, 1)), and a row of predictions.
  integer(c_int) function kfsdp_features(model, in_features, out_features) result(status)
    type(kfsdp_model), intent(in) :: model
    integer, intent(out) :: in_features, out_features
    integer(c_size_t) :: n_in, n_out
    status = c_features(model%handle, n_in, n_out)
    in_features = int(n_in)
    out_features = int(n_out)
  end function kfsdp_features

  ! outputs(k + (i - 1) * out_features) is prediction k of inputs(:, i).
  integer(c_int) function kfsdp_predict(model, inputs, outputs) result(status)
    type(kfsdp_model), intent(in) :: model
    real(c_double), contiguous, intent(in) :: inputs(:, :)
    real(c_double), contiguous, intent(inout) :: outputs(:)
    status = c_predict(model%handle, inputs, int(size(inputs, 2), c_size_t), int(size(inputs, 1), c_size_t), outputs, &
                       int(size(outputs), c_size_t))
  end function kfsdp_predict

  ! Frees the model (a null one: nothing); the last one finalizes Kokkos if kfsdp_load started it.
  subroutine kfsdp_free(model)
    type(kfsdp_model), intent(inout) :: model
    call c_free(model%handle)
    model%handle = c_null_ptr
  end subroutine kfsdp_free

  ! The message of this thread's last failed call ('' if none).
  function kfsdp_last_error() result(message)
    character(len=:), allocatable :: message
    type(c_ptr) :: text
    character(kind=c_char), pointer :: chars(:)
    integer :: i
    text = c_last_error()
    if (.not. c_associated(text)) then
      message = ''
      return
    end if
    call c_f_pointer(text, chars, [c_strlen(text)])
    allocate (character(len=size(chars)) :: message)
    do i = 1, size(chars)
      message(i:i) = chars(i)
    end do
  end function kfsdp_last_error

end module kfsdp_infer
