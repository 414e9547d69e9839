! heat_solver — a Fortran solver's time loop calling the trained heat surrogate through the C API
! (kfsdp_infer module, libheat_surrogate; no MPI). A Gaussian heat source circles the unit square;
! each step the surrogate predicts the steady temperature on an n x n grid for the source where it
! is, and the step's temperatures are printed to 17 digits with the hottest node.
!
!   mpirun -np 2 build/examples/train_surrogate --save surrogate.safetensors
!   build/examples/heat_solver surrogate.safetensors [STEPS [GRID]]
!
! Prints "step K source X0 Y0 AMPLITUDE WIDTH", then "u X Y U" for every node, then
! "hottest X Y U"; the features of node (x, y) are (x, y, x0, y0, amplitude, width).
program heat_solver
  use, intrinsic :: iso_c_binding, only: c_double, c_int
  use, intrinsic :: iso_fortran_env, only: error_unit
  use kfsdp_infer
  implicit none
  real(c_double), parameter :: pi = 4 * atan(1.0_c_double), amplitude = 1.5_c_double, width = 0.1_c_double
  character(len=4096) :: path, argument
  integer :: steps = 4, n = 8, step, i, j, node, in_features, out_features, hottest(1)
  real(c_double) :: h, x0, y0
  real(c_double), allocatable :: features(:, :), u(:)
  type(kfsdp_model) :: model

  if (command_argument_count() < 1) then
    write (error_unit, '(a)') 'usage: heat_solver MODEL.safetensors [STEPS [GRID]]'
    stop 2
  end if
  call get_command_argument(1, path)
  if (command_argument_count() >= 2) then
    call get_command_argument(2, argument)
    read (argument, *) steps
  end if
  if (command_argument_count() >= 3) then
    call get_command_argument(3, argument)
    read (argument, *) n
  end if

  call check(kfsdp_load(path, model))
  call check(kfsdp_features(model, in_features, out_features))
  if (in_features /= 6 .or. out_features /= 1) then
    write (error_unit, '(a, i0, a, i0, a)') 'error: the model takes ', in_features, ' features and gives ', out_features, &
      ', expected 6 and 1 (the heat surrogate)'
    stop 2
  end if
  allocate (features(6, n * n), u(n * n))
  h = 1.0_c_double / (n + 1)

  do step = 1, steps
    ! The source moves a quarter of the way round a circle about the centre each step.
    x0 = 0.5_c_double + 0.2_c_double * cos(2 * pi * (step - 1) / 4)
    y0 = 0.5_c_double + 0.2_c_double * sin(2 * pi * (step - 1) / 4)
    do j = 1, n
      do i = 1, n
        node = (j - 1) * n + i
        features(:, node) = [i * h, j * h, x0, y0, amplitude, width]
      end do
    end do
    call check(kfsdp_predict(model, features, u))
    write (*, '(a, i0, a, 4(1x, es24.16e3))') 'step ', step, ' source', x0, y0, amplitude, width
    do node = 1, n * n
      write (*, '(a, 3(1x, es24.16e3))') 'u', features(1, node), features(2, node), u(node)
    end do
    hottest = maxloc(u)
    write (*, '(a, 3(1x, es24.16e3))') 'hottest', features(1, hottest(1)), features(2, hottest(1)), u(hottest(1))
  end do
  call kfsdp_free(model)

contains

  ! Stops with the C API's message where a call failed.
  subroutine check(status)
    integer(c_int), intent(in) :: status
    if (status /= KFSDP_OK) then
      write (error_unit, '(a, i0, 2a)') 'error: status ', status, ': ', kfsdp_last_error()
      stop 2
    end if
  end subroutine check

end program heat_solver
