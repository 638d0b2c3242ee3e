"""The tabletop scene (MJCF) shared by every manipulation task.

Units: metres, kilograms, seconds. The table top is the plane z = 0; the robot works
from the -y side. A position-controlled end effector (three slide joints with gravity
compensation) carries a two-finger parallel gripper whose fingers close along y. The
scene always holds three blocks (red, green, blue), a bin, a yellow target zone, a
drawer in a cabinet and two buttons (red, blue): the instruction, not the scene, says
what to do. Object poses are randomised per episode by the env.

Contact groups: drawer geoms (contype 2) touch only the gripper (contype 3), so the
drawer never jams on the table or cabinet.
"""

BLOCK_COLORS = {"red": "0.85 0.15 0.15 1", "green": "0.15 0.7 0.2 1", "blue": "0.15 0.3 0.85 1"}
BUTTON_COLORS = {"red": "0.9 0.1 0.1 1", "blue": "0.1 0.2 0.95 1"}
BLOCK_HALF = 0.02
FINGER_MAX = 0.045  # each finger's max distance from the gripper centre line (m)


def _blocks() -> str:
    out = []
    for name, rgba in BLOCK_COLORS.items():
        out.append(f"""
    <body name="block_{name}" pos="0 0 {BLOCK_HALF}">
      <freejoint name="block_{name}"/>
      <geom type="box" size="{BLOCK_HALF} {BLOCK_HALF} {BLOCK_HALF}" rgba="{rgba}" mass="0.05"
            friction="1.5 0.02 0.001" condim="4" solref="0.01 1"/>
    </body>""")
    return "".join(out)


def _buttons() -> str:
    out = []
    for name, rgba in BUTTON_COLORS.items():
        out.append(f"""
    <body name="button_{name}" pos="0.25 0 0">
      <geom type="cylinder" size="0.035 0.01" pos="0 0 0.01" rgba="0.3 0.3 0.3 1"/>
      <body name="cap_{name}" pos="0 0 0.03">
        <joint name="button_{name}" type="slide" axis="0 0 1" range="-0.02 0" stiffness="40"
               springref="0" damping="2" limited="true"/>
        <geom type="cylinder" size="0.025 0.01" rgba="{rgba}" mass="0.02"/>
      </body>
    </body>""")
    return "".join(out)


SCENE_XML = f"""
<mujoco model="tabletop">
  <compiler angle="radian" autolimits="true"/>
  <option timestep="0.005" integrator="implicitfast" cone="elliptic" impratio="5"/>
  <visual>
    <quality shadowsize="512" offsamples="0"/>
    <global offwidth="512" offheight="512"/>
    <headlight ambient="0.4 0.4 0.4" diffuse="0.5 0.5 0.5"/>
  </visual>
  <default>
    <geom solref="0.005 1"/>
  </default>
  <worldbody>
    <light pos="0 -0.2 1.2" dir="0 0.2 -1" castshadow="false" diffuse="0.6 0.6 0.6"/>
    <geom name="table" type="plane" size="0.45 0.45 0.02" rgba="0.82 0.76 0.66 1" friction="0.8 0.01 0.001"/>
    <geom name="zone" type="box" size="0.045 0.045 0.0005" pos="-0.12 -0.1 0.0005" rgba="0.95 0.85 0.1 1"
          contype="0" conaffinity="0"/>
    <camera name="front" pos="0 -0.62 0.5" xyaxes="1 0 0 0 0.62 0.78" fovy="55"/>
    <camera name="top" pos="0 0.02 0.9" xyaxes="1 0 0 0 1 0" fovy="50"/>
    <camera name="side" pos="0.7 0.0 0.45" xyaxes="0 1 0 -0.5 0 0.85" fovy="50"/>

    <body name="gripper" pos="0 0 0" gravcomp="1">
      <joint name="ee_x" type="slide" axis="1 0 0" damping="40"/>
      <joint name="ee_y" type="slide" axis="0 1 0" damping="40"/>
      <joint name="ee_z" type="slide" axis="0 0 1" damping="40"/>
      <geom name="palm" type="box" size="0.018 0.058 0.008" pos="0 0 0.032" rgba="0.25 0.25 0.28 1" mass="0.4"
            contype="3" conaffinity="3"/>
      <geom name="mast" type="cylinder" size="0.012 0.06" pos="0 0 0.1" rgba="0.5 0.5 0.55 1" mass="0.05"
            contype="0" conaffinity="0"/>
      <site name="ee" pos="0 0 0" size="0.004" rgba="1 1 1 0"/>
      <body name="finger_l" pos="0 0 0" gravcomp="1">
        <joint name="finger_l" type="slide" axis="0 1 0" range="0 {FINGER_MAX}" damping="2"/>
        <geom type="box" size="0.012 0.005 0.022" pos="0 0.005 0.002" rgba="0.35 0.35 0.38 1" mass="0.03"
              friction="1.5 0.02 0.001" condim="4" contype="3" conaffinity="3"/>
      </body>
      <body name="finger_r" pos="0 0 0" gravcomp="1">
        <joint name="finger_r" type="slide" axis="0 -1 0" range="0 {FINGER_MAX}" damping="2"/>
        <geom type="box" size="0.012 0.005 0.022" pos="0 -0.005 0.002" rgba="0.35 0.35 0.38 1" mass="0.03"
              friction="1.5 0.02 0.001" condim="4" contype="3" conaffinity="3"/>
      </body>
    </body>
    {_blocks()}

    <body name="bin" pos="0.19 0.2 0">
      <geom type="box" size="0.065 0.065 0.003" pos="0 0 0.003" rgba="0.45 0.3 0.2 1"/>
      <geom type="box" size="0.065 0.004 0.025" pos="0 0.061 0.025" rgba="0.45 0.3 0.2 1"/>
      <geom type="box" size="0.065 0.004 0.025" pos="0 -0.061 0.025" rgba="0.45 0.3 0.2 1"/>
      <geom type="box" size="0.004 0.065 0.025" pos="0.061 0 0.025" rgba="0.45 0.3 0.2 1"/>
      <geom type="box" size="0.004 0.065 0.025" pos="-0.061 0 0.025" rgba="0.45 0.3 0.2 1"/>
    </body>

    <body name="cabinet" pos="-0.19 0.3 0">
      <geom type="box" size="0.1 0.1 0.003" pos="0 0 0.047" rgba="0.55 0.45 0.35 1"/>
      <geom type="box" size="0.004 0.1 0.022" pos="0.096 0 0.022" rgba="0.55 0.45 0.35 1"/>
      <geom type="box" size="0.004 0.1 0.022" pos="-0.096 0 0.022" rgba="0.55 0.45 0.35 1"/>
      <geom type="box" size="0.1 0.004 0.022" pos="0 0.096 0.022" rgba="0.55 0.45 0.35 1"/>
      <body name="drawer" pos="0 0 0">
        <joint name="drawer" type="slide" axis="0 -1 0" range="0 0.2" damping="8" frictionloss="0.05"/>
        <geom type="box" size="0.088 0.09 0.018" pos="0 0 0.023" rgba="0.7 0.55 0.4 1" mass="0.3"
              contype="2" conaffinity="2"/>
        <geom type="box" size="0.092 0.004 0.022" pos="0 -0.094 0.023" rgba="0.6 0.45 0.3 1" mass="0.05"
              contype="2" conaffinity="2"/>
        <geom name="handle" type="capsule" fromto="-0.04 -0.125 0.03 0.04 -0.125 0.03" size="0.006"
              rgba="0.8 0.8 0.82 1" mass="0.02" contype="2" conaffinity="2" friction="1.5 0.02 0.001" condim="4"/>
        <geom type="box" size="0.005 0.014 0.005" pos="-0.04 -0.111 0.03" rgba="0.8 0.8 0.82 1" contype="2" conaffinity="2"/>
        <geom type="box" size="0.005 0.014 0.005" pos="0.04 -0.111 0.03" rgba="0.8 0.8 0.82 1" contype="2" conaffinity="2"/>
      </body>
    </body>
    {_buttons()}
  </worldbody>

  <actuator>
    <position name="ee_x" joint="ee_x" kp="2500" ctrlrange="-0.4 0.4"/>
    <position name="ee_y" joint="ee_y" kp="2500" ctrlrange="-0.4 0.4"/>
    <position name="ee_z" joint="ee_z" kp="2500" ctrlrange="-0.2 0.3"/>
    <position name="finger_l" joint="finger_l" kp="300" ctrlrange="0 {FINGER_MAX}"/>
    <position name="finger_r" joint="finger_r" kp="300" ctrlrange="0 {FINGER_MAX}"/>
  </actuator>
</mujoco>
"""
